use std::collections::HashMap;

use super::*;

/// The encoder the server does not need: for round trips.
fn encode(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u64, 0u32);
    for &byte in src {
        let (code, len) = CODES[usize::from(byte)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
    out
}

/// Bit by bit, straight from the code list: what the table-driven decoder must agree with.
fn reference(src: &[u8]) -> Option<Vec<u8>> {
    let codes: HashMap<(u32, u8), usize> = CODES
        .iter()
        .enumerate()
        .map(|(symbol, &(code, len))| ((code, len), symbol))
        .collect();
    let (mut out, mut code, mut len) = (Vec::new(), 0u32, 0u8);
    for bit in src
        .iter()
        .flat_map(|byte| (0..8).rev().map(move |i| byte >> i & 1))
    {
        code = code << 1 | u32::from(bit);
        len += 1;
        if let Some(&symbol) = codes.get(&(code, len)) {
            if symbol == 256 {
                return None;
            }
            out.push(symbol as u8);
            (code, len) = (0, 0);
        }
    }
    (len <= 7 && code == (1 << len) - 1).then_some(out)
}

fn decoded(src: &[u8]) -> Result<Vec<u8>, HpackError> {
    let mut out = Vec::new();
    decode(src, &mut out).map(|()| out)
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn decodes_the_rfc_examples() {
    let cases: [(&[u8], &str); 4] = [
        (
            &[
                0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
            ],
            "www.example.com",
        ),
        (&[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf], "no-cache"),
        (
            &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f],
            "custom-key",
        ),
        (&[0x64, 0x02], "302"),
    ];
    for (src, text) in cases {
        assert_eq!(decoded(src).unwrap(), text.as_bytes());
        assert_eq!(encode(text.as_bytes()), src);
    }
    assert_eq!(decoded(&[]).unwrap(), b"");
}

#[test]
fn every_byte_round_trips_alone_and_together() {
    let all: Vec<u8> = (0..=255).collect();
    for byte in &all {
        let one = std::slice::from_ref(byte);
        assert_eq!(decoded(&encode(one)).unwrap(), one, "byte {byte}");
    }
    assert_eq!(decoded(&encode(&all)).unwrap(), all);
}

#[test]
fn rejects_eos_and_bad_padding() {
    let eos = Err(HpackError("EOS in a Huffman string"));
    assert_eq!(decoded(&[0xff, 0xff, 0xff, 0xff]), eos);
    // 'a' (00011) then EOS's 30 ones then a one of padding.
    assert_eq!(decoded(&[0x1f, 0xff, 0xff, 0xff, 0xff]), eos);
    let long = Err(HpackError("Huffman padding longer than 7 bits"));
    assert_eq!(decoded(&[0xff]), long);
    // '0' (00000) then 11 ones.
    assert_eq!(decoded(&[0x07, 0xff]), long);
    let not_ones = Err(HpackError("Huffman padding not all ones"));
    // '0' then 000: the zeros are the start of another '0', cut short.
    assert_eq!(decoded(&[0x00]), not_ones);
    assert_eq!(decoded(&[0x06]), not_ones);
    // '0' then 111: fine.
    assert_eq!(decoded(&[0x07]).unwrap(), b"0");
}

#[test]
fn output_is_bounded_by_the_shortest_code() {
    // Forty '0's, 5 bits each: 25 bytes.
    let src = encode(&[b'0'; 40]);
    assert_eq!(src.len(), 25);
    let mut out = Vec::new();
    decode(&src, &mut out).unwrap();
    assert_eq!(out.len(), 40);
    assert!(out.len() <= src.len() * 8 / 5);
}

#[test]
fn agrees_with_the_bit_by_bit_decoder_on_random_input() {
    let mut state = 0x9e37_79b9_7f4a_7c15;
    for round in 0..3000 {
        let len = (xorshift(&mut state) % 40) as usize;
        let mut src: Vec<u8> = (0..len).map(|_| xorshift(&mut state) as u8).collect();
        if round % 2 == 0 {
            // Mostly valid strings: encoded random text, sometimes with its last byte changed.
            let text: Vec<u8> = src.iter().map(|b| b' ' + b % 95).collect();
            src = encode(&text);
            if round % 4 == 0 {
                if let Some(last) = src.last_mut() {
                    *last ^= xorshift(&mut state) as u8;
                }
            }
        }
        let fast = decoded(&src).ok();
        assert_eq!(fast, reference(&src), "input {src:02x?}");
    }
}
