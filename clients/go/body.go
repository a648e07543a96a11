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
// untouched: for a route whose cost is in the body (a GraphQL query).
func ReadBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > max {
		return nil, ErrBodyTooLarge
	}
	return raw, nil
}
