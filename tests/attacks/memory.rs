//! Attacks on memory: clients that keep to every rule of HTTP/2 and make the server hold what
//! they send (bodies never finished) or what it answers (answers to a client whose window is
//! closed). The daemon's RSS stays within the budget the settings give, whatever the number of
//! connections, and a well-behaved client is answered throughout.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::daemon::{peak_rss, Daemon, Monitor, MIB};
use crate::raw::*;

/// The budget the memory attacks run under (`limits.grpc_memory_bytes`).
const BUDGET: usize = 16 * MIB;
/// What the daemon may grow by under attack: its budget and a margin for the allocator and
/// the tasks the attack starts.
const GROWTH: usize = BUDGET + 16 * MIB;

fn budget_settings() -> String {
    format!("grpc_memory_bytes = {BUDGET}")
}

/// One connection of the body attack: 256 streams, each sent 65,535 body bytes under a gRPC
/// prefix announcing 100,000, never finished, as far as the connection window the server gives
/// allows (waiting up to `patience` for more); the body bytes it got written.
async fn unfinished_bodies(addr: std::net::SocketAddr, patience: Duration) -> (usize, Attacker) {
    let mut attacker = Attacker::open(addr, &[], 0).await;
    let mut sent: i64 = 0;
    let mut written = 0;
    let chunk = vec![b'x'; 16_383];
    'streams: for _ in 0..256 {
        let stream = attacker.stream();
        if !attacker
            .send(&frame(HEADERS, END_HEADERS, stream, &block()))
            .await
        {
            break;
        }
        let mut body = vec![0u8];
        body.extend_from_slice(&100_000u32.to_be_bytes());
        let mut left = 65_535usize;
        while left > 0 {
            let piece = if body.is_empty() {
                &chunk[..left.min(chunk.len())]
            } else {
                &body[..]
            };
            let len = piece.len() as i64;
            let by = Instant::now() + patience;
            while DEFAULT_WINDOW + attacker.heard.window.load(Ordering::Acquire) - sent < len {
                if Instant::now() > by || attacker.ended() {
                    break 'streams;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if !attacker.send(&frame(DATA, 0, stream, piece)).await {
                break 'streams;
            }
            sent += len;
            written += piece.len();
            left -= piece.len();
            body.clear();
        }
    }
    (written, attacker)
}

async fn bodies_never_finished(connections: usize) {
    let daemon = Daemon::start(&budget_settings());
    let before = daemon.rss();
    let monitor = Monitor::start(&daemon).await;
    let addr = daemon.grpc;
    let (peak, attackers) = peak_rss(&daemon, async move {
        let tasks: Vec<_> = (0..connections)
            .map(|_| tokio::spawn(unfinished_bodies(addr, Duration::from_millis(1500))))
            .collect();
        let mut attackers = Vec::new();
        for task in tasks {
            attackers.push(task.await.expect("joined"));
        }
        attackers
    })
    .await;
    let seen = monitor.stop().await;
    let written: usize = attackers.iter().map(|(w, _)| w).sum();
    eprintln!(
        "{connections} connections of unfinished bodies: {written} body bytes taken; RSS {} -> \
         peak {} MiB; budget refusals: {} connections, {} streams",
        before / MIB,
        peak / MIB,
        daemon.metric("sluice_grpc_budget_refusals_total{kind=\"connection\"}"),
        daemon.metric("sluice_grpc_budget_refusals_total{kind=\"stream\"}"),
    );
    assert!(
        peak < before + GROWTH,
        "RSS grew from {before} to {peak} bytes (bound: {GROWTH} over the start)"
    );
    // What the server took is bounded by the connections it admitted and their windows.
    assert!(
        written <= (BUDGET / MIB + 1) * 512 * 1024,
        "{written} body bytes taken from {connections} connections"
    );
    seen.assert_served(3);
}

/// 4 connections of 256 streams with 65,535 body bytes each, never finished (was: 20.7 to
/// 152.7 MiB in 0.7 s, about 32 MiB a connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_bodies_stay_within_the_budget() {
    bodies_never_finished(4).await;
}

/// The same with 64 connections (16 was 536.6 MiB): past the budget, connections are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_bodies_on_64_connections_stay_within_the_budget() {
    bodies_never_finished(64).await;
}

/// One connection with SETTINGS_INITIAL_WINDOW_SIZE 0 and 256 whole requests: every answer
/// waits for a window the client never opens.
async fn answers_never_read(addr: std::net::SocketAddr) -> Attacker {
    let mut attacker = Attacker::open(addr, &[(SETTINGS_INITIAL_WINDOW_SIZE, 0)], 0).await;
    let mut bytes = Vec::new();
    for _ in 0..256 {
        let stream = attacker.stream();
        bytes.extend_from_slice(&request_frames(stream));
    }
    attacker.send(&bytes).await;
    attacker
}

async fn stalled_answers(connections: usize) {
    let daemon = Daemon::start(&budget_settings());
    let before = daemon.rss();
    let monitor = Monitor::start(&daemon).await;
    let addr = daemon.grpc;
    let (peak, attackers) = peak_rss(&daemon, async move {
        let mut attackers = Vec::new();
        for _ in 0..connections {
            attackers.push(answers_never_read(addr).await);
        }
        // Their answers are made meanwhile.
        tokio::time::sleep(Duration::from_secs(2)).await;
        attackers
    })
    .await;
    let seen = monitor.stop().await;
    let refused = daemon.metric("sluice_grpc_budget_refusals_total{kind=\"connection\"}");
    let held = daemon.metric("sluice_grpc_memory_bytes");
    eprintln!(
        "{connections} connections with answers never read: RSS {} -> peak {} MiB; held {} \
         MiB; {refused} connections refused",
        before / MIB,
        peak / MIB,
        held / MIB as f64,
    );
    assert!(
        peak < before + GROWTH,
        "RSS grew from {before} to {peak} bytes (bound: {GROWTH} over the start)"
    );
    assert!(held <= BUDGET as f64, "{held} bytes held over the budget");
    assert!(
        refused >= (connections - BUDGET / MIB) as f64,
        "{refused} connections refused of {connections}"
    );
    drop(attackers);
    seen.assert_served(3);
}

/// 200 connections with a closed window and 256 answered streams each (was 72.6 MiB, kept for
/// 30 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_a_closed_window_stay_within_the_budget() {
    stalled_answers(200).await;
}

/// The same with 800 connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_a_closed_window_on_800_connections_stay_within_the_budget() {
    stalled_answers(800).await;
}
