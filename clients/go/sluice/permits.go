package sluice

import (
	"context"
	"log"
	"net/http"
	"sync"
)

// Release gives back the permit an allowed check answered (Answer.Result.Permit, a concurrency
// policy's): POST /v1/release. The answer's Result.Released is true when the slot came back,
// false when nothing was held any more (released already, or expired): releasing is idempotent.
// An error is an *Error: the daemon could not be asked (the permit returns at its permit_ttl).
func (c *Client) Release(ctx context.Context, permit string) (Answer, error) {
	return c.Call(ctx, "/v1/release", struct {
		Permit string `json:"permit"`
	}{permit})
}

// Releaser is what the middleware releases permits through: a *Client, or one of the
// application's own around it.
type Releaser interface {
	Release(ctx context.Context, permit string) (Answer, error)
}

// heldPermit is a permit the middleware gives back once, whoever asks first; a release that
// fails is logged (never the permit itself: it names the partition).
type heldPermit struct {
	once    sync.Once
	through Releaser
	permit  string
	logger  *log.Logger
}

func (h *heldPermit) release() {
	h.once.Do(func() {
		// Not the request's context: it is cancelled by then (a client gone, a timeout).
		answer, err := h.through.Release(context.Background(), h.permit)
		switch {
		case err != nil:
			h.logger.Printf("sluice: a permit's release failed (it returns at its permit_ttl): %v", err)
		case answer.Status != http.StatusOK:
			h.logger.Printf("sluice: the daemon refused a permit's release (%d): %s: %s", answer.Status, answer.Result.Error, answer.Result.Reason)
		}
	})
}

// serveHolding runs next while held is held: given back when next returns or panics, or as soon
// as the request's context ends first (the client went away, also mid-stream; a
// http.TimeoutHandler's deadline passed), whichever comes first, once.
func serveHolding(held *heldPermit, next http.Handler, w http.ResponseWriter, r *http.Request) {
	returned := make(chan struct{})
	go func() {
		select {
		case <-r.Context().Done():
			held.release()
		case <-returned:
		}
	}()
	defer func() {
		close(returned)
		held.release()
	}()
	next.ServeHTTP(w, r)
}
