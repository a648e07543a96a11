'use strict';
// sluice-ratelimit: a client of the sluice rate-limit sidecar (Unix socket or TCP, kept-alive
// connections, a deadline per call), Express/Connect middleware and a fetch-style handler wrapper
// answering the documented 429 and 503, and the client's address behind proxies. `node:http` only.

const { Client, SluiceError, parseUrl, RATE_LIMIT_HEADERS } = require('./client');
const { OPEN, CLOSED, replyFor, SidecarWatch } = require('./reply');
const { trustedProxies, clientAddress, parseAddress } = require('./address');
const { sluice } = require('./express');
const { withSluice } = require('./fetch');

module.exports = {
  Client, SluiceError, parseUrl, RATE_LIMIT_HEADERS, OPEN, CLOSED, replyFor, sluice, withSluice,
  SidecarWatch, trustedProxies, clientAddress, parseAddress,
};
