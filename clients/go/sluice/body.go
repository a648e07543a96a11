package sluice

import (
	"bytes"
	"errors"
	"io"
	"net/http"
)

// ErrBodyTooLarge is ReadBody's error for a body over its bound.
var ErrBodyTooLarge = errors.New("request body too large")

// ReadBody reads r's body, at most max bytes, and puts back a copy the handler reads as if
// untouched: for a route whose cost is in the body (a GraphQL query). Over max it returns
// ErrBodyTooLarge and leaves the whole body readable (what was read, then the rest); a route
// should then answer 413 (RouteCheck.Refuse) rather than price the request without its body.
func ReadBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	body := r.Body
	raw, err := io.ReadAll(io.LimitReader(body, max+1))
	if err == nil && int64(len(raw)) > max {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(raw), body), body}
		return nil, ErrBodyTooLarge
	}
	_ = body.Close()
	r.Body = io.NopCloser(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	return raw, nil
}
