//! A client's RST_STREAM drops its check: one still waiting for the store is never sent, so an
//! Envoy that gave up on a check (its timeout) spends nothing for it.

use sluice::config::HumanDuration;

use super::*;
use crate::grpc_client::request as rls_request;
use crate::redis_server::RedisServer;

const POLICIES: &str = "
policies:
  - {name: per-user, match: {user: '*'}, key: [user], algorithm: fixed_window, limit: 10, period: 1h, failure_mode: closed}
";

/// A framed request for `user`.
fn for_user(user: &str) -> Vec<u8> {
    let body = rls_request("d", vec![descriptor(&[("user", user)])]).encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&body);
    out
}

fn frames(stream: u32, user: &str) -> Vec<u8> {
    let mut out = frame(HEADERS, END_HEADERS, stream, &block());
    push_frame(&mut out, DATA, END_STREAM, stream, &for_user(user));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_reset_before_it_reached_the_store_is_not_sent() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    settings.redis.url = Some(redis.url());
    settings.redis.key_prefix = "reset-before-store".into();
    // One pipeline at a time, and a deadline far beyond the pause: the second check waits in
    // the batcher's queue while the first is with a paused Redis.
    settings.redis.pipelines_in_flight = 1;
    settings.redis.timeout = HumanDuration(20_000_000);
    let daemon = spawn_grpc_in(dir, settings, POLICIES).await;
    daemon.app.wait_for_store().await;
    let mut conn = Conn::open(daemon.addr).await;
    assert_eq!(
        conn.check_with(&frames(conn.next, "u")).await,
        Outcome::Code(OK)
    );

    redis.signal("STOP");
    let sent = conn.stream();
    conn.send(&frames(sent, "u")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reset = conn.stream();
    conn.send(&frames(reset, "u")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    conn.send(&frame(RST_STREAM, 0, reset, &8u32.to_be_bytes()))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.signal("CONT");
    assert_eq!(conn.reader.outcome(sent).await, Outcome::Code(OK));

    // Two spent (the first check and the one sent before the pause ended): 8 left.
    let mut allowed = 0;
    for _ in 0..12 {
        if conn.check_with(&frames(conn.next, "u")).await == Outcome::Code(OK) {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 8, "the reset check was spent");
}
