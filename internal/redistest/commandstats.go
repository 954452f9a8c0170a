package redistest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CommandCalls answers how many times the Redis of c ran each command since it started or since
// its last CONFIG RESETSTAT (INFO commandstats), the commands that scripts and functions run
// included, by the name Redis gives it: "hmget", "function|load".
func CommandCalls(t testing.TB, c redis.Cmdable) map[string]int {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for line := range strings.SplitSeq(info, "\n") {
		// cmdstat_hmget:calls=3,usec=…
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		calls[name], _ = strconv.Atoi(n)
	}
	return calls
}
