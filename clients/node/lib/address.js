'use strict';
// The client's real address behind proxies: trustedProxies() walks X-Forwarded-For (or Forwarded)
// from the right, as nginx's real_ip and Envoy's xff_num_trusted_hops do, and returns the first
// address no trusted proxy vouches for. The default trusts nothing: the socket peer is the client.

const net = require('node:net');

const X_FORWARDED_FOR = 'x-forwarded-for';
const FORWARDED = 'forwarded';

/**
 * An IP address from a header entry or a peer ('192.0.2.7', '192.0.2.7:4711', '2001:db8::1',
 * '[2001:db8::1]:4711', '"[2001:db8::1]"'); an IPv4-mapped IPv6 address as its IPv4 address;
 * null for anything else ('unknown', an obfuscated '_hidden', garbage).
 */
function parseAddress(text) {
  if (typeof text !== 'string') return null;
  let value = text.trim().replace(/^"|"$/g, '');
  if (value.startsWith('[')) {
    const end = value.indexOf(']');
    if (end < 0 || (value.length > end + 1 && value[end + 1] !== ':')) return null;
    value = value.slice(1, end);
  } else if (value.split(':').length === 2) {
    value = value.split(':')[0];
  }
  value = value.split('%')[0];
  const kind = net.isIP(value);
  if (kind === 0) return null;
  if (kind === 6) {
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(value);
    if (mapped) return { address: mapped[1], family: 'ipv4' };
    return { address: value.toLowerCase(), family: 'ipv6' };
  }
  return { address: value, family: 'ipv4' };
}

/** The for= of each element of a Forwarded header (RFC 7239), in order. */
function forwardedFor(value) {
  return value.split(',').map((element) => {
    let found = '';
    for (const pair of element.split(';')) {
      const at = pair.indexOf('=');
      if (at > 0 && pair.slice(0, at).trim().toLowerCase() === 'for') found = pair.slice(at + 1).trim();
    }
    return found;
  });
}

/** A header's value from Node's headers object (arrays joined, as repeated headers are). */
function headerValue(headers, name) {
  const value = headers && (typeof headers.get === 'function' ? headers.get(name) : headers[name]);
  return Array.isArray(value) ? value.join(', ') : (value || '');
}

/**
 * The proxies in front of the application: `trusted`, CIDRs ('10.0.0.0/8', '::1/128'; the
 * word 'unix' for a peer on a Unix socket), or `hops`, how many proxies stand in front (the socket
 * peer being the nearest); `header`: 'x-forwarded-for' (the default) or 'forwarded'.
 * trustedProxies() trusts nothing. Returns `{ clientAddress(peer, headers) }`.
 */
function trustedProxies({ trusted = [], hops = 0, header = X_FORWARDED_FOR } = {}) {
  if (!Array.isArray(trusted)) throw new TypeError('trusted is an array of CIDRs');
  if (trusted.length > 0 && hops) throw new TypeError('give trusted CIDRs or a hop count, not both');
  if (!Number.isInteger(hops) || hops < 0) throw new TypeError('hops is a whole number, 0 or more');
  if (![X_FORWARDED_FOR, FORWARDED].includes(header)) throw new TypeError(`header is '${X_FORWARDED_FOR}' or '${FORWARDED}'`);
  const list = new net.BlockList();
  let unix = false;
  for (const cidr of trusted) {
    if (cidr === 'unix') {
      unix = true;
      continue;
    }
    const [base, bits, extra] = String(cidr).split('/');
    const at = parseAddress(base);
    const prefix = bits === undefined ? (at && at.family === 'ipv4' ? 32 : 128) : Number(bits);
    const max = at && at.family === 'ipv4' ? 32 : 128;
    if (!at || extra !== undefined || !Number.isInteger(prefix) || prefix < 0 || prefix > max || (bits !== undefined && !/^\d+$/.test(bits))) {
      throw new TypeError(`${JSON.stringify(cidr)} is not a CIDR such as 10.0.0.0/8`);
    }
    list.addSubnet(at.address, prefix, at.family);
  }
  const trusts = (at) => at !== null && list.check(at.address, at.family);
  const chain = (headers) => {
    const value = headerValue(headers, header);
    if (!value.trim()) return [];
    return header === FORWARDED ? forwardedFor(value) : value.split(',').map((entry) => entry.trim());
  };
  return {
    /**
     * The client's address: the socket `peer` unless a trusted proxy is the peer, then the first
     * entry from the right of the header no trusted proxy vouches for. null only for a Unix-socket
     * peer nothing vouches for.
     */
    clientAddress(peer, headers) {
      const at = parseAddress(peer);
      const trustedPeer = (at === null && unix && !peer) || trusts(at) || hops > 0;
      const own = at ? at.address : null;
      if (!trustedPeer) return own;
      const entries = chain(headers);
      if (hops) {
        if (entries.length === 0) return own;
        const found = parseAddress(entries.length >= hops ? entries[entries.length - hops] : entries[0]);
        return found ? found.address : own;
      }
      let last = at;
      for (let i = entries.length - 1; i >= 0; i--) {
        const found = parseAddress(entries[i]);
        if (!found) break; // a trusted proxy passed on something that is not an address: stop at it
        last = found;
        if (!trusts(found)) return found.address;
      }
      return last ? last.address : null;
    },
  };
}

/**
 * The address of the client of a Node request (`req.socket.remoteAddress` and its headers) given
 * `proxies` (trustedProxies(); default: trust nothing). Use this rather than Express's `req.ip`
 * with 'trust proxy' set to true, which takes the leftmost entry (the client's own choice).
 */
function clientAddress(req, proxies = trustedProxies()) {
  return proxies.clientAddress(req.socket ? req.socket.remoteAddress : undefined, req.headers);
}

module.exports = { trustedProxies, clientAddress, parseAddress, X_FORWARDED_FOR, FORWARDED };
