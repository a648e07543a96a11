//! The attacks of the attack suite (`crates/daemon/tests/attacks`), as frames for one connection
//! over `tokio::io::duplex`: each one alone with the refusal it earns, and each one as a piece
//! of the property test's arbitrary frame sequences.

use super::*;

/// A request block for the unary path that ends in an HPACK bomb: one field of `value` bytes
/// put in the dynamic table, then referenced `refs` times (a block of about `value + refs`
/// bytes that decodes to `refs` times `value`).
fn bomb(value: usize, refs: usize) -> Vec<u8> {
    let mut block = block(UNARY);
    block.push(0x40); // a literal with incremental indexing, a new name
    hpack_int(&mut block, 0, 7, 5);
    block.extend_from_slice(b"x-big");
    hpack_int(&mut block, 0, 7, value);
    block.extend(std::iter::repeat_n(b'a', value));
    // The newest dynamic entry is index 62 (an indexed field: 0x80 | 62).
    block.extend(std::iter::repeat_n(0x80 | 62, refs));
    block
}

/// RFC 7541 section 5.1: `value` with a `prefix`-bit prefix after the bits of `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// One attack of the suite, its sizes chosen by the strategy.
#[derive(Debug, Clone)]
pub(super) enum Attack {
    /// `streams` unary calls, each sent `chunks` DATA frames of 15,000 bytes, never finished.
    UnfinishedBodies { streams: u32, chunks: usize },
    /// SETTINGS_INITIAL_WINDOW_SIZE=0, then `streams` unary calls answered into closed windows,
    /// then a flood of `flood` frames of `kind` (SETTINGS, or WINDOW_UPDATE(0, +1)).
    StalledThenFlood {
        streams: u32,
        flood: usize,
        kind: u8,
    },
    /// A HEADERS without END_HEADERS, then `frames` zero-length CONTINUATION frames.
    Continuations { frames: usize },
    /// An open stream, then `frames` frames of `kind` that carry nothing (empty DATA,
    /// PRIORITY, PING, an unknown type).
    Empty { kind: u8, frames: usize },
    /// `streams` streams each opened and reset at once.
    Resets { streams: u32 },
    /// `blocks` HPACK bombs, each on a new stream.
    Bombs { blocks: u32 },
}

impl Attack {
    /// The attack's frames, after the client's preface and SETTINGS.
    pub(super) fn frames(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match *self {
            Self::UnfinishedBodies { streams, chunks } => {
                for stream in 0..streams {
                    let id = 2 * stream + 1;
                    push(
                        &mut out,
                        frame::HEADERS,
                        frame::END_HEADERS,
                        id,
                        &block(UNARY),
                    );
                    for _ in 0..chunks {
                        push(&mut out, frame::DATA, 0, id, &[7; 15_000]);
                    }
                }
            }
            Self::StalledThenFlood {
                streams,
                flood,
                kind,
            } => {
                let zero_window = [0, 4, 0, 0, 0, 0];
                push(&mut out, frame::SETTINGS, 0, 0, &zero_window);
                for stream in 0..streams {
                    let id = 2 * stream + 1;
                    push(
                        &mut out,
                        frame::HEADERS,
                        frame::END_HEADERS,
                        id,
                        &block(UNARY),
                    );
                    push(
                        &mut out,
                        frame::DATA,
                        frame::END_STREAM,
                        id,
                        b"\0\0\0\0\x02hi",
                    );
                }
                for _ in 0..flood {
                    if kind == frame::SETTINGS {
                        push(&mut out, frame::SETTINGS, 0, 0, &zero_window);
                    } else {
                        push(&mut out, frame::WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes());
                    }
                }
            }
            Self::Continuations { frames } => {
                push(&mut out, frame::HEADERS, 0, 1, &block(UNARY));
                for _ in 0..frames {
                    push(&mut out, frame::CONTINUATION, 0, 1, &[]);
                }
            }
            Self::Empty { kind, frames } => {
                push(
                    &mut out,
                    frame::HEADERS,
                    frame::END_HEADERS,
                    1,
                    &block(UNARY),
                );
                let payload: &[u8] = match kind {
                    frame::PRIORITY => &[0, 0, 0, 0, 16],
                    frame::PING => &[0; 8],
                    _ => &[],
                };
                let stream = if kind == frame::PING { 0 } else { 1 };
                for _ in 0..frames {
                    push(&mut out, kind, 0, stream, payload);
                }
            }
            Self::Resets { streams } => {
                for stream in 0..streams {
                    let id = 2 * stream + 1;
                    push(
                        &mut out,
                        frame::HEADERS,
                        frame::END_HEADERS,
                        id,
                        &block(UNARY),
                    );
                    push(&mut out, frame::RST_STREAM, 0, id, &8u32.to_be_bytes());
                }
            }
            Self::Bombs { blocks } => {
                let bomb = bomb(1_000, 20);
                for stream in 0..blocks {
                    let id = 2 * stream + 1;
                    let flags = frame::END_HEADERS | frame::END_STREAM;
                    push(&mut out, frame::HEADERS, flags, id, &bomb);
                }
            }
        }
        out
    }
}

/// Any attack, at sizes from harmless to past every bound.
pub(super) fn any_attack() -> impl Strategy<Value = Attack> {
    let unknown = 0x20u8;
    prop_oneof![
        (1u32..=20, 1usize..=5)
            .prop_map(|(streams, chunks)| Attack::UnfinishedBodies { streams, chunks }),
        (
            0u32..=16,
            prop_oneof![Just(0usize), 1usize..100, 10_000usize..10_050],
            prop_oneof![Just(frame::SETTINGS), Just(frame::WINDOW_UPDATE)]
        )
            .prop_map(|(streams, flood, kind)| Attack::StalledThenFlood {
                streams,
                flood,
                kind
            }),
        (0usize..40).prop_map(|frames| Attack::Continuations { frames }),
        (
            prop_oneof![
                Just(frame::DATA),
                Just(frame::PRIORITY),
                Just(frame::PING),
                Just(unknown)
            ],
            prop_oneof![1usize..100, 10_000usize..10_050]
        )
            .prop_map(|(kind, frames)| Attack::Empty { kind, frames }),
        prop_oneof![1u32..50, 2_000u32..2_050].prop_map(|streams| Attack::Resets { streams }),
        prop_oneof![1u32..20, 2_000u32..2_010].prop_map(|blocks| Attack::Bombs { blocks }),
    ]
}

/// The code of the first GOAWAY the server wrote, if any.
fn goaway(out: &[u8]) -> Option<u8> {
    frames(out)
        .into_iter()
        .find(|f| f.0 == frame::GOAWAY)
        .and_then(|f| f.3.get(7).copied())
}

/// Serves `attack` alone: the GOAWAY's code, and checks the bounds every attack keeps.
fn refusal(attack: Attack) -> Option<u8> {
    let (out, peak, budget) = runtime().block_on(serve(&attack.frames()));
    let base = connection_base(256 * 1024, 16, PER_STREAM_BYTES);
    assert!(peak <= base, "{attack:?} held {peak} over the base {base}");
    assert_eq!(budget.used(), 0, "{attack:?}: the charge is returned");
    goaway(&out)
}

const CALM: Option<u8> = Some(Code::EnhanceYourCalm as u8);

#[test]
fn unfinished_bodies_past_the_window_are_a_flow_control_error_and_within_it_are_held() {
    let past = Attack::UnfinishedBodies {
        streams: 16,
        chunks: 4,
    };
    assert_eq!(refusal(past), Some(Code::FlowControl as u8));
    let within = Attack::UnfinishedBodies {
        streams: 4,
        chunks: 4,
    };
    assert_eq!(refusal(within), None);
}

#[test]
fn answers_stalled_on_a_zero_window_are_held_and_floods_beside_them_calmed() {
    for kind in [frame::SETTINGS, frame::WINDOW_UPDATE] {
        let stalled = Attack::StalledThenFlood {
            streams: 16,
            flood: 0,
            kind,
        };
        assert_eq!(refusal(stalled), None);
        let flood = Attack::StalledThenFlood {
            streams: 16,
            flood: 10_001,
            kind,
        };
        assert_eq!(refusal(flood), CALM, "a flood of frame type {kind}");
    }
}

#[test]
fn floods_of_frames_that_carry_nothing_are_calmed() {
    assert_eq!(refusal(Attack::Continuations { frames: 17 }), CALM);
    for kind in [frame::DATA, frame::PRIORITY, frame::PING, 0x20] {
        let flood = Attack::Empty {
            kind,
            frames: 10_001,
        };
        assert_eq!(refusal(flood), CALM, "a flood of frame type {kind}");
    }
}

#[test]
fn reset_floods_and_hpack_bombs_are_calmed() {
    assert_eq!(refusal(Attack::Resets { streams: 2_001 }), CALM);
    assert_eq!(refusal(Attack::Bombs { blocks: 2_001 }), CALM);
    // One bomb is one refused stream: answered, not a connection error.
    let (out, _, _) = runtime().block_on(serve(&Attack::Bombs { blocks: 1 }.frames()));
    assert_eq!(goaway(&out), None);
    assert!(frames(&out)
        .iter()
        .any(|f| f.0 == frame::HEADERS && f.2 == 1 && f.1 & frame::END_STREAM != 0));
}
