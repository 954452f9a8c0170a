# tablease as a small non-root image: a static binary built in a Go image, copied into Alpine
# (which brings wget for the healthchecks of docker-compose.yml and CA certificates for rediss://).
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t tablease .
FROM golang:1.26.8-alpine AS build
ARG VERSION=devel
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/tablease ./cmd/tablease

FROM alpine:3.22
RUN apk add --no-cache ca-certificates && adduser -D -H -u 10001 tablease
COPY --from=build /out/tablease /usr/local/bin/tablease
USER 10001:10001
ENV TABLEASE_ADDR=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["tablease"]
CMD ["serve"]
