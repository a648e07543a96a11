//! HPACK's Huffman code (RFC 7541 section 5.2 and Appendix B): the decoder of Huffman-coded
//! string literals. The code is canonical (codes of one length are consecutive, and each length's
//! first code follows the previous length's last), so one look-up of the next 10 bits decodes
//! every symbol of at most 10 bits (all letters, digits and the common punctuation) and the rare
//! longer ones are found by comparing the next 32 bits against each length's upper bound. Both
//! tables are computed at compile time from the 257 (code, length) pairs below.

use super::hpack::HpackError;

/// RFC 7541 Appendix B: the (code, length in bits) of each symbol, bytes 0..=255 then EOS (256).
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

/// The end-of-string symbol: it must never appear in a string (RFC 7541 5.2).
const EOS: u16 = 256;

/// Codes of at most this many bits are decoded by one look-up in [`FAST`].
const FAST_BITS: u32 = 10;

/// Indexed by the next [`FAST_BITS`] bits: `length << 8 | symbol` when they start with a code of
/// at most [`FAST_BITS`] bits, 0 when the code is longer.
static FAST: [u16; 1 << FAST_BITS] = fast_table();

/// The canonical code's layout, for the codes longer than [`FAST_BITS`].
struct Canonical {
    /// `limit[len]`: one past the last code of at most `len` bits, left-aligned in 32 bits (so a
    /// 32-bit window below it starts with a code of at most `len` bits).
    limit: [u64; 31],
    /// `delta[len]`: added (wrapping) to a `len`-bit code, its position in `symbols`.
    delta: [u32; 31],
    /// The symbols in code order (by length, then by code).
    symbols: [u16; 257],
}

static CANONICAL: Canonical = canonical();

const fn fast_table() -> [u16; 1 << FAST_BITS] {
    let mut table = [0u16; 1 << FAST_BITS];
    let mut symbol = 0;
    while symbol < CODES.len() {
        let (code, len) = CODES[symbol];
        let len = len as u32;
        if len <= FAST_BITS {
            let first = (code << (FAST_BITS - len)) as usize;
            let mut i = 0;
            while i < 1 << (FAST_BITS - len) {
                table[first + i] = ((len as u16) << 8) | symbol as u16;
                i += 1;
            }
        }
        symbol += 1;
    }
    table
}

/// Lays the code out by length, and checks at compile time that it is canonical and complete
/// (which the decoder relies on: every window of bits starts with exactly one code).
const fn canonical() -> Canonical {
    let mut out = Canonical {
        limit: [0; 31],
        delta: [0; 31],
        symbols: [0; 257],
    };
    let mut placed = 0;
    let mut next_code: u32 = 0;
    let mut len = 1;
    while len <= 30 {
        out.delta[len] = (placed as u32).wrapping_sub(next_code);
        let mut symbol = 0;
        while symbol < CODES.len() {
            let (code, bits) = CODES[symbol];
            if bits as usize == len {
                assert!(code == next_code, "the Huffman code is not canonical");
                next_code += 1;
                out.symbols[placed] = symbol as u16;
                placed += 1;
            }
            symbol += 1;
        }
        out.limit[len] = (next_code as u64) << (32 - len);
        next_code <<= 1;
        len += 1;
    }
    assert!(
        placed == CODES.len() && out.limit[30] == 1 << 32,
        "the Huffman code is incomplete"
    );
    out
}

/// The symbol that the 32-bit window `window` starts with, and its length in bits.
#[inline]
fn symbol(window: u32) -> (u16, u32) {
    let entry = FAST[(window >> (32 - FAST_BITS)) as usize];
    if entry != 0 {
        return (entry & 0xff, u32::from(entry >> 8));
    }
    let mut len = FAST_BITS + 1;
    while len < 30 && u64::from(window) >= CANONICAL.limit[len as usize] {
        len += 1;
    }
    let position = (window >> (32 - len)).wrapping_add(CANONICAL.delta[len as usize]);
    let symbol = CANONICAL.symbols.get(position as usize).copied();
    (symbol.unwrap_or(EOS), len)
}

/// Decodes the Huffman-coded string `src`, appending its bytes to `out` (which grows by at most
/// `src.len() * 8 / 5`: no code is shorter than 5 bits). Rejects the EOS symbol, and padding that
/// is longer than 7 bits or not all ones.
pub(super) fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    out.reserve(src.len() * 8 / 5);
    // The bits not yet decoded, left-aligned; `bits` of them are counted. Below them may lie
    // copies of the next bytes' first bits (from an 8-byte refill), which a later refill ORs
    // again in place.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    let mut next = 0;
    loop {
        if bits < 30 {
            if let Some(word) = src.get(next..).and_then(<[u8]>::first_chunk::<8>) {
                acc |= u64::from_be_bytes(*word) >> bits;
                let taken = (63 - bits) / 8;
                next += taken as usize;
                bits += taken * 8;
            } else {
                while bits <= 56 {
                    let Some(&byte) = src.get(next) else { break };
                    acc |= u64::from(byte) << (56 - bits);
                    next += 1;
                    bits += 8;
                }
            }
        }
        if bits == 0 {
            return Ok(());
        }
        let window = (acc >> 32) as u32;
        let (symbol, len) = symbol(window);
        if len > bits {
            // The input is exhausted (a refill leaves at least 30 bits otherwise): what is left is
            // padding, the most significant bits of EOS.
            if bits > 7 {
                return Err(HpackError("Huffman padding longer than 7 bits"));
            }
            if window >> (32 - bits) != (1 << bits) - 1 {
                return Err(HpackError("Huffman padding not all ones"));
            }
            return Ok(());
        }
        if symbol == EOS {
            return Err(HpackError("EOS in a Huffman string"));
        }
        out.push(symbol as u8);
        acc <<= len;
        bits -= len;
    }
}

#[cfg(test)]
mod tests;
