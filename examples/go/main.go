// Command sluice-check asks a sluice daemon whether a request may go through, with the
// github.com/sluice-rs/sluice/clients/go/sluice package (standard library only).
//
//	go run . --socket /var/run/sluice/sluice.sock -p login -d ip=203.0.113.7
//	go run . --url http://127.0.0.1:7070 -d tenant=acme -d api_key=k1 --cost 5
//
// The flags are `sluice check`'s; defaults come from SLUICE_SOCKET / SLUICE_URL (set by `sluice
// inject` in every app container). Exit code 0 allowed, 1 denied (429), 2 limiter unavailable
// (503), 64 bad usage or rejected request (4xx), 69 daemon unreachable.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	sluice "github.com/sluice-rs/sluice/clients/go/sluice"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	flags, err := ParseCheckFlags(args)
	if errors.Is(err, ErrHelp) {
		fmt.Printf("Usage: sluice-check [options]\nAsk a sluice daemon whether a request may go through.\n\n%s\n", CheckFlagsHelp)
		return ExitAllowed
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "usage error: %v\n", err)
		return ExitUsage
	}
	// Explicit flags first, then SLUICE_SOCKET, then SLUICE_URL (the client's own defaults).
	client, err := sluice.NewClient(flags.Options)
	if err != nil {
		fmt.Fprintf(os.Stderr, "usage error: %v\n", err)
		return ExitUsage
	}
	answer, err := client.Check(context.Background(), flags.Check)
	if err != nil {
		// A middleware chooses here per route: fail open (serve the request) or closed (503).
		fmt.Fprintf(os.Stderr, "sluice unreachable: %v\n", err)
		return ExitUnreachable
	}
	result := answer.Result
	switch {
	case flags.JSON:
		fmt.Println(string(answer.Body))
	case answer.Status == 200:
		fmt.Printf("allowed policy=%s remaining=%s mode=%s\n", str(result.Policy), num(result.Remaining), result.Mode)
	case answer.Status == 429:
		// When to come back: the daemon's own math, also in Retry-After.
		fmt.Printf("denied policy=%s retry_after_sec=%d retry-after-header=%s\n", str(result.Policy),
			result.RetryAfterSec, answer.Headers.Get("Retry-After"))
	case answer.Status == 503:
		fmt.Printf("unavailable policy=%s\n", str(result.Policy))
	default:
		fmt.Fprintf(os.Stderr, "error %d: %s: %s\n", answer.Status, result.Error, result.Reason)
	}
	switch answer.Status {
	case 200:
		return ExitAllowed
	case 429:
		return ExitDenied
	case 503:
		return ExitUnavailable
	}
	return ExitUsage
}

func str(p *string) string {
	if p == nil {
		return "None"
	}
	return *p
}

func num(p *uint64) string {
	if p == nil {
		return "None"
	}
	return fmt.Sprint(*p)
}
