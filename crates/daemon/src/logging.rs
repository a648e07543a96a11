//! What keeps the log an operator's record rather than a client's: every field of a text line is
//! written with control characters escaped (a value sent by a client cannot start a forged line
//! or move the cursor), and warnings a client can trigger pass a [`LogGate`] (at most one line per
//! quiet period, counting what was held back).

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::field::Field;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::{debug_fn, Writer};
use tracing_subscriber::fmt::FormatFields;

/// The text formatter's fields: `name=value` separated by spaces, the message bare, as the
/// default formatter writes them, but with CR, LF, ESC and every other control character in a
/// value (Display or Debug) written as an escape (`\n`, `\u{1b}`).
pub fn text_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    debug_fn(
        |writer: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug| {
            if field.name() != "message" {
                write!(writer, "{}=", field.name())?;
            }
            write!(Escaping(writer), "{value:?}")
        },
    )
    .delimited(" ")
}

/// Writes through to `W`, escaping control characters.
struct Escaping<W>(W);

impl<W: fmt::Write> fmt::Write for Escaping<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(char::is_control) {
            self.0.write_str(&rest[..at])?;
            let control = rest[at..].chars().next().unwrap_or_default();
            match control {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                other => write!(self.0, "\\u{{{:x}}}", u32::from(other))?,
            }
            rest = &rest[at + control.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// At most one log line per quiet period for a warning that clients can cause.
pub struct LogGate {
    quiet_ms: u64,
    started: Instant,
    /// Milliseconds after `started` of the last line, plus one (0: never).
    last_ms: AtomicU64,
    held_back: AtomicU64,
}

impl LogGate {
    /// A gate that lets one line through per `quiet`.
    pub fn new(quiet: Duration) -> Self {
        Self {
            quiet_ms: u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX),
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were held back since the
    /// last one; `None` (and one more held back) otherwise.
    pub fn pass(&self) -> Option<u64> {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        let open = last == 0 || now.saturating_sub(last) >= self.quiet_ms;
        if open
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    #[test]
    fn a_client_value_cannot_start_a_line_of_its_own() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .fmt_fields(text_fields())
            .finish();
        let forged = "login\n2026-12-04T00:00:00Z  WARN sluice: admin said \u{1b}[31mok\r";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(policy = %forged, quoted = forged, "refused {forged}");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.ends_with('\n'));
        assert!(
            text.contains(
                r"policy=login\n2026-12-04T00:00:00Z  WARN sluice: admin said \u{1b}[31mok\r"
            ),
            "{text}"
        );
        assert!(text.contains(r#"quoted="login\n2026"#), "{text}");
        assert!(text.contains(r"refused login\n2026"), "{text}");
    }

    #[test]
    fn the_gate_passes_one_line_per_quiet_period_and_counts_the_rest() {
        let gate = LogGate::new(Duration::from_secs(3600));
        assert_eq!(gate.pass(), Some(0));
        assert_eq!(gate.pass(), None);
        assert_eq!(gate.pass(), None);
        let open = LogGate::new(Duration::ZERO);
        assert_eq!(open.pass(), Some(0));
        assert_eq!(open.pass(), Some(0));
    }
}
