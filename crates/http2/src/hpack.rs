//! HPACK (RFC 7541): the decoder of one connection's request header blocks, and the few encoder
//! pieces its answers need. The server never indexes what it sends (it keeps no dynamic table of
//! its own), so encoding is literals without indexing; decoding follows the peer's dynamic table
//! exactly, since every later block depends on it. Input is untrusted: every length and index is
//! checked against what is there, integers are bounded, and no allocation is made for an indexed
//! field or a raw string (they are borrowed from the tables and the block).

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;

use bytes::{BufMut, BytesMut};

use super::huffman;

/// Why a header block cannot be decoded: a connection error (COMPRESSION_ERROR in HTTP/2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HpackError(pub &'static str);

impl fmt::Display for HpackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for HpackError {}

/// What one decoded block came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// True when the field list went over `max_list`: the fields after that were not passed on.
    pub oversized: bool,
    /// The first field RFC 9113 section 8.2.1 calls malformed, if any ([`field_problem`]).
    pub malformed: Option<&'static str>,
}

/// The bytes a field name may not have (RFC 9113 section 8.2.1): controls and space, upper
/// case, DEL and above, and `:` (a pseudo-header's leading colon is taken off first).
const NAME_REFUSES: [bool; 256] = {
    let mut refuses = [false; 256];
    let mut b = 0;
    while b < 256 {
        refuses[b] = b <= 0x20 || (b >= 0x41 && b <= 0x5a) || b >= 0x7f || b == 0x3a;
        b += 1;
    }
    refuses
};

/// RFC 9113 section 8.2.1: a field name is lower-case and visible (a pseudo-header's leading
/// colon aside); a value has no NUL, CR or LF and no leading or trailing space or tab. Checked
/// once per literal field: a field from the static table is valid, and one from the dynamic
/// table was checked when it entered.
pub(super) fn field_problem(name: &[u8], value: &[u8]) -> Option<&'static str> {
    let bare = name.strip_prefix(b":").unwrap_or(name);
    if bare.is_empty() {
        return Some("an empty header name");
    }
    if bare.iter().any(|&b| NAME_REFUSES[usize::from(b)]) {
        return Some(
            "a header name with a character it may not have (upper case, space, controls)",
        );
    }
    if memchr::memchr3(0, b'\r', b'\n', value).is_some() {
        return Some("a header value with NUL, CR or LF");
    }
    if matches!(value.first(), Some(b' ' | b'\t')) || matches!(value.last(), Some(b' ' | b'\t')) {
        return Some("a header value with leading or trailing white space");
    }
    None
}

/// What an entry costs beyond its name and value, in the table (RFC 7541 4.1) and in a field list
/// (RFC 9113 6.5.2).
const ENTRY_OVERHEAD: usize = 32;

/// Continuation bytes an integer may have: 4 carry 28 bits, which is more than any length or
/// index a block can hold.
const MAX_CONTINUATIONS: u32 = 4;

/// The Huffman scratch buffer is dropped after a block that grew it past this.
const SCRATCH_KEEP: usize = 16 * 1024;

/// RFC 7541 Appendix A: the static table, index 1 first.
static STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// One dynamic table entry: name and value in one allocation, and what is malformed in it.
struct Entry {
    bytes: Box<[u8]>,
    name_len: usize,
    problem: Option<&'static str>,
}

impl Entry {
    fn new(name: &[u8], value: &[u8], problem: Option<&'static str>) -> Self {
        let mut bytes = Vec::with_capacity(name.len() + value.len());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        Self {
            bytes: bytes.into_boxed_slice(),
            name_len: name.len(),
            problem,
        }
    }

    fn name(&self) -> &[u8] {
        self.bytes.get(..self.name_len).unwrap_or_default()
    }

    fn value(&self) -> &[u8] {
        self.bytes.get(self.name_len..).unwrap_or_default()
    }

    fn size(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }
}

/// The decoding context of one connection: the static table and this connection's dynamic table.
pub struct Decoder {
    /// Newest first: index 62 is `dynamic[0]`.
    dynamic: VecDeque<Entry>,
    /// The sum of the entries' sizes.
    size: usize,
    /// The table's maximum size, as the peer last set it.
    max_size: usize,
    /// The largest maximum size the peer may set (our SETTINGS_HEADER_TABLE_SIZE).
    limit: usize,
    /// Huffman-decoded name and value of the field being decoded.
    scratch: Vec<u8>,
}

impl Decoder {
    /// `table_limit`: the SETTINGS_HEADER_TABLE_SIZE we advertised (4096 by default): the largest
    /// dynamic table size an encoder may ask for with a size update.
    pub fn new(table_limit: usize) -> Self {
        Self {
            dynamic: VecDeque::new(),
            size: 0,
            max_size: table_limit,
            limit: table_limit,
            scratch: Vec::new(),
        }
    }

    /// Decodes one whole header block (HEADERS + CONTINUATION fragments already joined), calling
    /// `field(name, value)` for each field in order. `max_list` bounds the list as RFC 9113
    /// SETTINGS_MAX_HEADER_LIST_SIZE counts it (name + value + 32 per field): once over, the rest
    /// of the block is still decoded (the dynamic table must stay in step with the peer's) but no
    /// more fields are passed to `field`, and `Decoded::oversized` is true.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<Decoded, HpackError> {
        let mut list = List {
            total: 0,
            max: max_list,
            oversized: false,
            malformed: None,
        };
        let result = self.decode_fields(block, &mut list, &mut field);
        if self.scratch.capacity() > SCRATCH_KEEP {
            self.scratch = Vec::new();
        }
        result.map(|()| Decoded {
            oversized: list.oversized,
            malformed: list.malformed,
        })
    }

    fn decode_fields(
        &mut self,
        block: &[u8],
        list: &mut List,
        field: &mut impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut input = Input { block, pos: 0 };
        let mut at_start = true;
        while let Some(first) = input.peek() {
            if first & 0x80 != 0 {
                // Indexed field (6.1).
                let index = input.int(7)?;
                let (name, value, problem) = lookup(&self.dynamic, index)?;
                list.malformed = list.malformed.or(problem);
                list.pass(name, value, field);
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (6.3): only before the block's first field (4.2).
                if !at_start {
                    return Err(HpackError("dynamic table size update after a field"));
                }
                let size = input.int(5)?;
                if size > self.limit {
                    return Err(HpackError("dynamic table size update over the limit"));
                }
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                // Literal field with incremental indexing (6.2.1, 01), without indexing (6.2.2,
                // 0000) or never indexed (6.2.3, 0001).
                let indexing = first & 0x40 != 0;
                let index = input.int(if indexing { 6 } else { 4 })?;
                self.scratch.clear();
                let name = match index {
                    0 => Some(input.string(&mut self.scratch)?),
                    _ => None,
                };
                let value = input.string(&mut self.scratch)?;
                let name = match name {
                    Some(name) => name.bytes(&self.scratch),
                    None => lookup(&self.dynamic, index)?.0,
                };
                let value = value.bytes(&self.scratch);
                let problem = field_problem(name, value);
                list.malformed = list.malformed.or(problem);
                list.pass(name, value, field);
                if indexing {
                    // Copied before any eviction: the name may be an entry about to go (4.4).
                    let size = name.len() + value.len() + ENTRY_OVERHEAD;
                    let entry = (size <= self.max_size).then(|| Entry::new(name, value, problem));
                    self.insert(size, entry);
                }
            }
            at_start = false;
        }
        Ok(())
    }

    /// Adds an entry of `size` (`None` when it is larger than the whole table, which then only
    /// empties it: RFC 7541 4.4).
    fn insert(&mut self, size: usize, entry: Option<Entry>) {
        match entry {
            Some(entry) => {
                self.evict(size);
                self.size += size;
                self.dynamic.push_front(entry);
            }
            None => {
                self.dynamic.clear();
                self.size = 0;
            }
        }
    }

    /// Evicts the oldest entries until `room` more bytes fit within the maximum size (4.3, 4.4).
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some(oldest) = self.dynamic.pop_back() else {
                break;
            };
            self.size -= oldest.size();
        }
    }
}

/// The field at `index` of the static table followed by the dynamic table (2.3.3), and what
/// is malformed in it (nothing in the static table).
type Field<'a> = (&'a [u8], &'a [u8], Option<&'static str>);

fn lookup(dynamic: &VecDeque<Entry>, index: usize) -> Result<Field<'_>, HpackError> {
    let position = index
        .checked_sub(1)
        .ok_or(HpackError("header table index 0"))?;
    if let Some((name, value)) = STATIC_TABLE.get(position) {
        return Ok((name.as_bytes(), value.as_bytes(), None));
    }
    dynamic
        .get(position - STATIC_TABLE.len())
        .map(|entry| (entry.name(), entry.value(), entry.problem))
        .ok_or(HpackError("header table index beyond the table"))
}

/// The field list's size so far, and whether it went over.
struct List {
    total: usize,
    max: usize,
    oversized: bool,
    /// The first malformed field.
    malformed: Option<&'static str>,
}

impl List {
    fn pass(&mut self, name: &[u8], value: &[u8], field: &mut impl FnMut(&[u8], &[u8])) {
        self.total = self
            .total
            .saturating_add(name.len() + value.len() + ENTRY_OVERHEAD);
        self.oversized |= self.total > self.max;
        if !self.oversized {
            field(name, value);
        }
    }
}

/// A string literal: raw in the block, or Huffman-decoded into the scratch buffer.
enum Str<'b> {
    Raw(&'b [u8]),
    Decoded(Range<usize>),
}

impl<'b> Str<'b> {
    fn bytes<'a>(self, scratch: &'a [u8]) -> &'a [u8]
    where
        'b: 'a,
    {
        match self {
            Self::Raw(bytes) => bytes,
            Self::Decoded(range) => scratch.get(range).unwrap_or_default(),
        }
    }
}

/// The unread rest of a block.
struct Input<'b> {
    block: &'b [u8],
    pos: usize,
}

impl<'b> Input<'b> {
    fn peek(&self) -> Option<u8> {
        self.block.get(self.pos).copied()
    }

    fn byte(&mut self) -> Result<u8, HpackError> {
        let byte = self.peek().ok_or(HpackError("truncated integer"))?;
        self.pos += 1;
        Ok(byte)
    }

    /// An integer with a `prefix`-bit prefix (5.1).
    fn int(&mut self, prefix: u8) -> Result<usize, HpackError> {
        let max_prefix = (1usize << prefix) - 1;
        let mut value = usize::from(self.byte()?) & max_prefix;
        if value < max_prefix {
            return Ok(value);
        }
        for continuation in 0..MAX_CONTINUATIONS {
            let byte = self.byte()?;
            value += usize::from(byte & 0x7f) << (7 * continuation);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(HpackError("integer over 2^28"))
    }

    /// A string literal (5.2); a Huffman-coded one is decoded onto the end of `scratch`.
    fn string(&mut self, scratch: &mut Vec<u8>) -> Result<Str<'b>, HpackError> {
        let huffman = self.peek().is_some_and(|first| first & 0x80 != 0);
        let len = self.int(7)?;
        let bytes = self
            .pos
            .checked_add(len)
            .and_then(|end| self.block.get(self.pos..end))
            .ok_or(HpackError("string literal longer than the block"))?;
        self.pos += len;
        if !huffman {
            return Ok(Str::Raw(bytes));
        }
        let start = scratch.len();
        huffman::decode(bytes, scratch)?;
        Ok(Str::Decoded(start..scratch.len()))
    }
}

/// Appends an HPACK integer: `first` holds the representation's flag bits, `prefix` is the
/// prefix length in bits (1..=8).
pub fn encode_int(value: usize, prefix: u8, first: u8, out: &mut BytesMut) {
    debug_assert!((1..=8).contains(&prefix), "prefix of {prefix} bits");
    let max_prefix = (1usize << prefix.clamp(1, 8)) - 1;
    let flags = first & !(max_prefix as u8);
    if value < max_prefix {
        out.put_u8(flags | value as u8);
        return;
    }
    out.put_u8(flags | max_prefix as u8);
    let mut rest = value - max_prefix;
    while rest >= 0x80 {
        out.put_u8(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.put_u8(rest as u8);
}

/// Appends a literal field without indexing, new name (0x00), name and value as raw (non-Huffman) strings.
pub fn encode_literal(name: &[u8], value: &[u8], out: &mut BytesMut) {
    out.reserve(1 + 2 * 5 + name.len() + value.len());
    out.put_u8(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

/// Appends a literal field without indexing whose name is static-table entry `index`.
pub fn encode_literal_indexed_name(index: usize, value: &[u8], out: &mut BytesMut) {
    out.reserve(2 * 5 + value.len());
    encode_int(index, 4, 0x00, out);
    encode_string(value, out);
}

/// A raw (H = 0) string literal.
fn encode_string(bytes: &[u8], out: &mut BytesMut) {
    encode_int(bytes.len(), 7, 0x00, out);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests;
