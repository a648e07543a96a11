// The flags of `sluice check` for this program: the CLI's, so that the two take one flag set
// (tests/deploy/clients.rs runs both with the same arguments).
package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	sluice "github.com/sluice-rs/sluice/clients/go/sluice"
)

// Exit codes shared with `sluice check`.
const (
	ExitAllowed     = 0
	ExitDenied      = 1
	ExitUnavailable = 2
	ExitUsage       = 64
	ExitUnreachable = 69
)

// ErrHelp is ParseCheckFlags' answer to -h/--help: print CheckFlagsHelp and exit 0.
var ErrHelp = errors.New("help requested")

// UsageError is a bad flag or value (exit 64).
type UsageError struct{ Message string }

func (e *UsageError) Error() string { return e.Message }

// CheckFlagsHelp describes the flags ParseCheckFlags takes.
const CheckFlagsHelp = `Options:
  -p, --policy NAME            check only this policy
  -d, --descriptor NAME=VALUE  a descriptor, repeatable: -d ip=203.0.113.7
      --cost N                 units to spend (default 1)
      --dry-run                evaluate without spending
      --socket PATH            daemon's Unix socket (default: $SLUICE_SOCKET, else $SLUICE_URL)
      --url, --http URL        daemon's TCP address: http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070
      --json                   print the daemon's JSON answer as is
  -h, --help                   print this help`

// CheckFlags are the options of `sluice check` this program takes:
// -p/--policy, -d/--descriptor (repeatable), --cost, --dry-run, --socket, --url/--http, --json,
// -h/--help; each value as `--flag VALUE` or `--flag=VALUE`. -c/--config (the daemon's settings
// file) is the CLI's alone.
type CheckFlags struct {
	sluice.Check
	sluice.Options
	JSON bool
}

// ParseCheckFlags parses args (without the program name): ErrHelp for -h/--help, a *UsageError
// for anything else wrong.
func ParseCheckFlags(args []string) (CheckFlags, error) {
	flags := CheckFlags{Check: sluice.Check{Descriptors: map[string]string{}, Cost: 1}}
	usage := func(format string, a ...interface{}) (CheckFlags, error) {
		return CheckFlags{}, &UsageError{fmt.Sprintf(format, a...)}
	}
	var socket, url *string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, value, hasValue := arg, "", false
		if strings.HasPrefix(arg, "-") {
			if at := strings.Index(arg, "="); at > 0 {
				name, value, hasValue = arg[:at], arg[at+1:], true
			}
		}
		takeValue := func() (string, bool) {
			if hasValue {
				return value, true
			}
			if i+1 >= len(args) {
				return "", false
			}
			i++
			return args[i], true
		}
		switch name {
		case "-h", "--help":
			return CheckFlags{}, ErrHelp
		case "--dry-run", "--json":
			if hasValue {
				return usage("%s takes no value", name)
			}
			if name == "--json" {
				flags.JSON = true
			} else {
				flags.DryRun = true
			}
		case "-p", "--policy", "-d", "--descriptor", "--cost", "--socket", "--url", "--http":
			v, ok := takeValue()
			if !ok {
				return usage("%s needs a value", name)
			}
			switch name {
			case "-p", "--policy":
				flags.Policy = v
			case "-d", "--descriptor":
				key, val, found := strings.Cut(v, "=")
				if !found || key == "" {
					return usage("descriptor %q is not NAME=VALUE", v)
				}
				flags.Descriptors[key] = val
			case "--cost":
				cost, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return usage("--cost %q is not a whole number", v)
				}
				if cost == 0 {
					return usage("--cost must be 1 or more")
				}
				flags.Cost = cost
			case "--socket":
				socket = &v
			default:
				if url != nil {
					return usage("--url and --http name the same address: give one")
				}
				url = &v
			}
		default:
			if strings.HasPrefix(arg, "-") {
				return usage("unknown flag %s", name)
			}
			return usage("unexpected argument %q", arg)
		}
	}
	if socket != nil && url != nil {
		return usage("--socket and --url cannot be used together")
	}
	if socket != nil {
		if *socket == "" {
			return usage("--socket needs a path")
		}
		flags.Socket = *socket
	}
	if url != nil {
		host, err := sluice.ParseURL(*url)
		if err != nil {
			return usage("--url %v", err)
		}
		flags.URL = "http://" + host
	}
	return flags, nil
}
