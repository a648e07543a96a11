// sluice-ratelimit as an ES module: the same objects as the CommonJS entry (lib/index.js).
import sluiceRatelimit from './index.js';

export const {
  Client, SluiceError, parseUrl, RATE_LIMIT_HEADERS, OPEN, CLOSED, replyFor, sluice, withSluice,
  SidecarWatch, trustedProxies, clientAddress, parseAddress,
} = sluiceRatelimit;
export default sluiceRatelimit;
