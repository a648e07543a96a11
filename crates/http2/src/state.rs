//! A stream's state (RFC 9113 section 5.1) as a server that never pushes sees it, and what each
//! frame a client sends does to it: the next state, or the error the RFC demands.
//!
//! There are no reserved states: the server sends no PUSH_PROMISE, so it reserves no stream, and
//! a client's PUSH_PROMISE is a connection error before any stream is looked at. A stream the
//! connection no longer keeps is idle when its id is above every id the client opened, closed
//! otherwise ([`State::forgotten`]).
//!
//! | state \ frame | HEADERS | DATA | WINDOW_UPDATE | RST_STREAM | PRIORITY |
//! |---|---|---|---|---|---|
//! | idle | opens (half-closed (remote) with END_STREAM) | connection `PROTOCOL_ERROR` | connection `PROTOCOL_ERROR` | connection `PROTOCOL_ERROR` | allowed |
//! | open, half-closed (local) | trailers: END_STREAM ends the client's side; without it, stream `PROTOCOL_ERROR` (section 8.1) | END_STREAM ends the client's side | allowed | closed | allowed |
//! | half-closed (remote) | stream `STREAM_CLOSED` | stream `STREAM_CLOSED` | allowed | closed | allowed |
//! | closed, we reset it | ignored (the client may have sent it before it knew) | ignored | ignored | ignored | allowed |
//! | closed, the client reset it | stream `STREAM_CLOSED` | stream `STREAM_CLOSED` | ignored | ignored (never a reset for a reset) | allowed |
//! | closed, both sides ended (or forgotten, and not among the streams we reset lately) | connection `STREAM_CLOSED` (frames after the client's END_STREAM) | connection `STREAM_CLOSED` (its window is counted) | ignored | ignored | allowed |

use crate::frame::Code;

/// A stream's state (RFC 9113 section 5.1), without the reserved states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No frame has opened it.
    Idle,
    /// Both sides may send.
    Open,
    /// The client ended its side (END_STREAM); the server may still send.
    HalfClosedRemote,
    /// The server ended its side; the client may still send.
    HalfClosedLocal,
    /// Neither side sends; how it closed decides what a late frame is.
    Closed(Closed),
}

/// How a stream closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The server reset it (RST_STREAM sent), or refused it.
    ResetByUs,
    /// The client reset it (RST_STREAM received).
    ResetByPeer,
    /// Both sides ended it, or the connection no longer knows how it closed.
    Ended,
}

/// A frame a client sends on a stream, as far as the stream's state goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// A header block: a request's head on an idle stream, trailers on an open one.
    Headers {
        end_stream: bool,
    },
    Data {
        end_stream: bool,
    },
    WindowUpdate,
    RstStream,
    Priority,
}

/// What the RFC makes of a frame its stream's state does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// A stream error: RST_STREAM with this code, and the stream closed.
    Stream(Code),
    /// A connection error: GOAWAY with this code.
    Connection(Code),
    /// Ignored (a DATA frame's window is still counted).
    Ignored,
}

impl State {
    /// The state of a stream the connection does not keep: idle above `last_opened` (the
    /// highest id the client opened), closed at or below it, reset by us if `reset_by_us`.
    pub fn forgotten(id: u32, last_opened: u32, reset_by_us: bool) -> Self {
        if id > last_opened {
            Self::Idle
        } else if reset_by_us {
            Self::Closed(Closed::ResetByUs)
        } else {
            Self::Closed(Closed::Ended)
        }
    }

    /// What receiving `frame` does: the next state, or the error.
    pub fn recv(self, frame: Recv) -> Result<Self, FrameError> {
        use FrameError::{Connection, Ignored, Stream};
        match (self, frame) {
            (_, Recv::Priority) => Ok(self),
            (Self::Idle, Recv::Headers { end_stream }) => Ok(if end_stream {
                Self::HalfClosedRemote
            } else {
                Self::Open
            }),
            (Self::Idle, _) => Err(Connection(Code::Protocol)),
            (Self::Open | Self::HalfClosedLocal, Recv::Headers { end_stream: false }) => {
                Err(Stream(Code::Protocol))
            }
            (
                Self::Open | Self::HalfClosedLocal,
                Recv::Headers { end_stream } | Recv::Data { end_stream },
            ) => Ok(if end_stream { self.recv_end() } else { self }),
            (Self::HalfClosedRemote, Recv::Headers { .. } | Recv::Data { .. }) => {
                Err(Stream(Code::StreamClosed))
            }
            (Self::Closed(_), Recv::WindowUpdate | Recv::RstStream) => Err(Ignored),
            (_, Recv::WindowUpdate) => Ok(self),
            (_, Recv::RstStream) => Ok(Self::Closed(Closed::ResetByPeer)),
            (Self::Closed(Closed::ResetByUs), _) => Err(Ignored),
            (Self::Closed(Closed::ResetByPeer), _) => Err(Stream(Code::StreamClosed)),
            (Self::Closed(Closed::Ended), Recv::Headers { .. } | Recv::Data { .. }) => {
                Err(Connection(Code::StreamClosed))
            }
        }
    }

    /// The client's END_STREAM.
    fn recv_end(self) -> Self {
        match self {
            Self::Open => Self::HalfClosedRemote,
            Self::HalfClosedLocal => Self::Closed(Closed::Ended),
            other => other,
        }
    }

    /// The server sends END_STREAM.
    pub fn send_end(self) -> Self {
        match self {
            Self::Open => Self::HalfClosedLocal,
            Self::HalfClosedRemote => Self::Closed(Closed::Ended),
            other => other,
        }
    }

    /// Whether the client may still send (DATA, trailers).
    pub fn recv_open(self) -> bool {
        matches!(self, Self::Open | Self::HalfClosedLocal)
    }

    /// Whether the server has ended its side (END_STREAM sent, or the stream reset).
    pub fn sent_end(self) -> bool {
        matches!(self, Self::HalfClosedLocal | Self::Closed(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [State; 7] = [
        State::Idle,
        State::Open,
        State::HalfClosedRemote,
        State::HalfClosedLocal,
        State::Closed(Closed::ResetByUs),
        State::Closed(Closed::ResetByPeer),
        State::Closed(Closed::Ended),
    ];

    const FRAMES: [Recv; 7] = [
        Recv::Headers { end_stream: false },
        Recv::Headers { end_stream: true },
        Recv::Data { end_stream: false },
        Recv::Data { end_stream: true },
        Recv::WindowUpdate,
        Recv::RstStream,
        Recv::Priority,
    ];

    /// The module's table, row by row: each state's answer to each frame, in `FRAMES`' order.
    fn expected(state: State) -> [Result<State, FrameError>; 7] {
        use FrameError::{Connection, Ignored, Stream};
        use State::*;
        let peer_reset = Ok(Closed(super::Closed::ResetByPeer));
        let ended = Closed(super::Closed::Ended);
        match state {
            Idle => [
                Ok(Open),
                Ok(HalfClosedRemote),
                Err(Connection(Code::Protocol)),
                Err(Connection(Code::Protocol)),
                Err(Connection(Code::Protocol)),
                Err(Connection(Code::Protocol)),
                Ok(Idle),
            ],
            Open => [
                Err(Stream(Code::Protocol)),
                Ok(HalfClosedRemote),
                Ok(Open),
                Ok(HalfClosedRemote),
                Ok(Open),
                peer_reset,
                Ok(Open),
            ],
            HalfClosedLocal => [
                Err(Stream(Code::Protocol)),
                Ok(ended),
                Ok(HalfClosedLocal),
                Ok(ended),
                Ok(HalfClosedLocal),
                peer_reset,
                Ok(HalfClosedLocal),
            ],
            HalfClosedRemote => [
                Err(Stream(Code::StreamClosed)),
                Err(Stream(Code::StreamClosed)),
                Err(Stream(Code::StreamClosed)),
                Err(Stream(Code::StreamClosed)),
                Ok(HalfClosedRemote),
                peer_reset,
                Ok(HalfClosedRemote),
            ],
            Closed(super::Closed::ResetByUs) => [
                Err(Ignored),
                Err(Ignored),
                Err(Ignored),
                Err(Ignored),
                Err(Ignored),
                Err(Ignored),
                Ok(state),
            ],
            Closed(super::Closed::ResetByPeer) => [
                Err(Stream(Code::StreamClosed)),
                Err(Stream(Code::StreamClosed)),
                Err(Stream(Code::StreamClosed)),
                Err(Stream(Code::StreamClosed)),
                Err(Ignored),
                Err(Ignored),
                Ok(state),
            ],
            Closed(super::Closed::Ended) => [
                Err(Connection(Code::StreamClosed)),
                Err(Connection(Code::StreamClosed)),
                Err(Connection(Code::StreamClosed)),
                Err(Connection(Code::StreamClosed)),
                Err(Ignored),
                Err(Ignored),
                Ok(state),
            ],
        }
    }

    #[test]
    fn every_state_answers_every_frame_as_the_table_says() {
        for state in STATES {
            for (frame, expected) in FRAMES.into_iter().zip(expected(state)) {
                assert_eq!(state.recv(frame), expected, "{state:?} receiving {frame:?}");
            }
        }
    }

    #[test]
    fn the_servers_end_and_the_clients_end_close_a_stream_in_either_order() {
        let end = Recv::Data { end_stream: true };
        assert_eq!(
            State::Open.send_end().recv(end),
            Ok(State::Closed(Closed::Ended))
        );
        assert_eq!(
            State::Open.recv(end).map(State::send_end),
            Ok(State::Closed(Closed::Ended))
        );
        for state in STATES {
            assert_eq!(
                state.recv_open(),
                matches!(state, State::Open | State::HalfClosedLocal)
            );
            assert_eq!(state.send_end().sent_end(), state != State::Idle);
        }
    }

    #[test]
    fn a_forgotten_stream_is_idle_above_the_last_id_and_closed_at_or_below_it() {
        assert_eq!(State::forgotten(7, 5, false), State::Idle);
        assert_eq!(State::forgotten(5, 5, false), State::Closed(Closed::Ended));
        assert_eq!(
            State::forgotten(3, 5, true),
            State::Closed(Closed::ResetByUs)
        );
    }
}
