package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=…"; otherwise the module version.
var version = ""

// Program is the command line, with its surroundings injected so that tests run the very code the
// binary runs.
type Program struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Environ, when set, lists the environment (os.Environ), for serve to warn of TABLEASE_
	// variables that nothing reads.
	Environ func() []string
	// OnListen, when set, is told the address the server listens on (tests bind port 0).
	OnListen func(addr string)
}

const usage = `usage: tablease <command> [flags]

commands:
  serve     run the lease service (tablease serve --help)
  token     mint an HS256 access token: tablease token --sub alice [--scope lease:admin] [--sid doc-1] [--ttl 1h]
  keygen    write a new Ed25519 lease-token signing key: tablease keygen [--out lease-key.pem] [--public-out lease-key.pub.pem]
  admin     call the admin API (token from TABLEASE_TOKEN; tablease admin --help):
              tablease admin leases [--sub S] [--limit N] [--cursor C]
              tablease admin lease --sub S --sid D
              tablease admin revoke --sub S --sid D --reason R [--block 5m] [--request-id ID]
              tablease admin audit [--sub S [--sid D]] [--limit N] [--cursor C]
  bench     measure a running tablease (tablease bench --help; scripts/bench runs it on a private Redis):
              tablease bench --url U [--work renew,acquire,streams,memory] [--pid tablease=PID] [--redis URL]
  version   print the version
`

// Main runs the command in args and returns the exit code: 0 on success, 1 when the command
// failed, 2 on a usage error (and 3 when `admin lease` or `admin revoke` found nothing).
func (p Program) Main(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(p.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return p.serve(ctx, args[1:])
	case "token":
		return p.token(args[1:])
	case "keygen":
		return p.keygen(args[1:])
	case "admin":
		return p.admin(ctx, args[1:])
	case "bench":
		return p.bench(ctx, args[1:])
	case "version", "--version", "-v":
		if len(args) > 1 {
			fmt.Fprintf(p.Stderr, "tablease: version takes no arguments (%q)\n", args[1:])
			return 2
		}
		fmt.Fprintln(p.Stdout, "tablease", Version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(p.Stdout, usage)
		return 0
	}
	fmt.Fprintf(p.Stderr, "tablease: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// Version is the version of this build.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// parseFlags parses args into fs, the flags of command (`tablease token`), and answers whether
// the command goes on, and else its exit code: --help writes usage and the flags to stdout (it
// is what was asked for) and answers 0; a bad flag or an argument left over is one line on
// stderr, and 2.
func (p Program) parseFlags(fs *flag.FlagSet, command, usage string, args []string) (int, bool) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		p.writeUsage(fs, usage)
		return 0, false
	case err != nil:
		fmt.Fprintf(p.Stderr, "%s: %v (%s --help lists the flags)\n", command, err, command)
		return 2, false
	case fs.NArg() > 0:
		fmt.Fprintf(p.Stderr, "%s: unexpected argument %q\n", command, fs.Arg(0))
		return 2, false
	}
	return 0, true
}

// writeUsage writes usage, then the flags of fs, to stdout: the answer to --help.
func (p Program) writeUsage(fs *flag.FlagSet, usage string) {
	fmt.Fprintln(p.Stdout, usage)
	out := fs.Output()
	fs.SetOutput(p.Stdout)
	fs.PrintDefaults()
	fs.SetOutput(out)
}
