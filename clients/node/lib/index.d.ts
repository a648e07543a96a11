// Types of sluice-ratelimit (lib/index.js, lib/index.mjs).
import type { IncomingMessage, ServerResponse } from 'node:http';

/** What a route does when the sidecar cannot be reached or does not answer in time. */
export type OnUnreachable = 'open' | 'closed';
export const OPEN: 'open';
export const CLOSED: 'closed';

/** One request's question (the body of POST /v1/check), and the route's failure mode. */
export interface Check {
  descriptors: Record<string, string>;
  policy?: string;
  /** Units to spend (default 1). */
  cost?: number;
  dryRun?: boolean;
  onUnreachable?: OnUnreachable;
}

/** The daemon's answer: HTTP status, JSON body, and its rate-limit headers (lower-case names). */
export interface Answer {
  status: number;
  body: {
    allowed?: boolean;
    policy?: string | null;
    limit?: number | null;
    remaining?: number | null;
    reset_after_ms?: number;
    retry_after_ms?: number;
    mode?: string;
    error?: string;
    reason?: string;
    retry_after_sec?: number;
    within_limit?: boolean;
    /** The permit an allowed check holds (a concurrency policy): give it back with release(). */
    permit?: string;
    /** A release's answer: whether a held permit was given back. */
    released?: boolean;
    [field: string]: unknown;
  };
  headers: Record<string, string>;
}

/** A middleware's reply: `status` null lets the request through with `headers` added. */
export interface Reply {
  status: number | null;
  headers: Record<string, string>;
  body?: string | Uint8Array;
}

/** The rate-limit headers the daemon sets (X-RateLimit-Reset: seconds from now, not an epoch). */
export const RATE_LIMIT_HEADERS: readonly string[];

/** The daemon could not be asked: unreachable, too slow, or an answer that is not HTTP/JSON. */
export class SluiceError extends Error {
  name: 'SluiceError';
}

export interface ClientOptions {
  /** A Unix socket path. */
  socket?: string;
  /** http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070. */
  url?: string;
  /** One deadline per call, in milliseconds (default 500). */
  timeoutMs?: number;
  maxSockets?: number;
}

export class Client {
  constructor(options?: ClientOptions);
  timeoutMs: number;
  check(check: Check): Promise<Answer>;
  report(check: Check): Promise<Answer>;
  /** POST /v1/release: gives back an allowed answer's `permit` (idempotent). */
  release(permit: string): Promise<Answer>;
  batch(checks: Check[]): Promise<Answer['body'][]>;
  call(path: string, body: unknown): Promise<Answer>;
  close(): void;
}

export function parseUrl(text: string): { hostname: string; port: number };

interface Logger {
  warn(line: string): void;
  error(line: string): void;
}

/** Counts decisions made without the sidecar and logs at most once per interval. */
export class SidecarWatch {
  constructor(options?: { onFallback?: FallbackHook | null; logIntervalMs?: number; log?: Logger });
  /** Decisions made without the sidecar so far. */
  count: number;
  record(check: Check, error: Error): void;
}

/** Called for every decision made without the sidecar. */
export type FallbackHook = (check: Check, error: SluiceError) => void;
/** May answer a denial the application's own way; null keeps the documented 429. */
export type DenyHook = (check: Check, answer: Answer) => Reply | null | undefined;

export interface MiddlewareOptions<R> {
  route: (request: R, ...rest: any[]) => Check | null | undefined | Promise<Check | null | undefined>;
  client?: Client;
  log?: Logger;
  onFallback?: FallbackHook | null;
  logIntervalMs?: number;
  onDenied?: DenyHook | null;
}

export function replyFor(check: Check, answer: Answer | null, error: Error | null, log?: Logger,
  options?: { watch?: SidecarWatch | null; onDenied?: DenyHook | null }): Reply;

/** Express/Connect middleware; `.watch.count` counts decisions made without the sidecar. */
export function sluice(options: MiddlewareOptions<IncomingMessage>):
  ((req: IncomingMessage, res: ServerResponse, next: (error?: unknown) => void) => void) & { watch: SidecarWatch };

/** A fetch-style handler (Request -> Response) behind sluice. */
export function withSluice<Rest extends unknown[]>(
  handler: (request: Request, ...rest: Rest) => Response | Promise<Response>,
  options: MiddlewareOptions<Request>,
): ((request: Request, ...rest: Rest) => Promise<Response>) & { watch: SidecarWatch };

export interface TrustedProxiesOptions {
  /** CIDRs of the proxies ('10.0.0.0/8'; 'unix' for a Unix-socket peer). */
  trusted?: string[];
  /** How many proxies stand in front (the socket peer being the nearest). */
  hops?: number;
  header?: 'x-forwarded-for' | 'forwarded';
}

export interface TrustedProxies {
  /** The client's address, walking the proxies' header from the right. */
  clientAddress(peer: string | undefined | null, headers: Record<string, string | string[] | undefined> | Headers): string | null;
}

export function trustedProxies(options?: TrustedProxiesOptions): TrustedProxies;
/** The client's address of a Node request given the proxies (default: trust nothing). */
export function clientAddress(req: { socket?: { remoteAddress?: string }; headers: IncomingMessage['headers'] },
  proxies?: TrustedProxies): string | null;
export function parseAddress(text: string): { address: string; family: 'ipv4' | 'ipv6' } | null;
