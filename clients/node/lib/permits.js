'use strict';
// The permit a middleware holds for a request a concurrency policy admitted: given back exactly
// once, whichever way the request ends; a release that fails is logged and never reaches the
// application's answer (the permit then returns by itself at the policy's `permit_ttl`).

/**
 * A function that releases `permit` through `client` the first time it is called and does
 * nothing after; it never throws nor rejects (a failure is logged, never the permit itself: it
 * names the partition). It returns the release's promise, settled when the daemon answered.
 */
function holdPermit(client, permit, log = console) {
  let done = null;
  return function release() {
    if (done) return done;
    done = Promise.resolve()
      .then(() => client.release(permit))
      .then((answer) => {
        if (answer.status !== 200) {
          log.warn(`sluice: the daemon refused a permit's release (${answer.status}): ${answer.body.error}: ${answer.body.reason}`);
        }
      }, (error) => {
        log.warn(`sluice: a permit's release failed (it returns at its permit_ttl): ${error && error.message}`);
      });
    return done;
  };
}

/**
 * `body` (a web ReadableStream) passed through; `release` is called when it ends, fails, or is
 * cancelled by its reader (a server adapter cancels it when the client goes away mid-stream).
 */
function releasingStream(body, release) {
  const reader = body.getReader();
  return new ReadableStream({
    async pull(controller) {
      let step;
      try {
        step = await reader.read();
      } catch (error) {
        release();
        controller.error(error);
        return;
      }
      if (step.done) {
        release();
        controller.close();
      } else {
        controller.enqueue(step.value);
      }
    },
    cancel(reason) {
      release();
      return reader.cancel(reason);
    },
  });
}

module.exports = { holdPermit, releasingStream };
