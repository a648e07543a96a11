use super::*;

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Decodes `block` with no list bound, the fields as `name: value` lines.
fn fields(decoder: &mut Decoder, block: &[u8]) -> Result<Vec<String>, HpackError> {
    let mut out = Vec::new();
    let decoded = decoder.decode(block, usize::MAX, |name, value| {
        out.push(format!("{}: {}", text(name), text(value)));
    })?;
    assert!(!decoded.oversized);
    Ok(out)
}

/// The dynamic table, newest first, and its size.
fn table(decoder: &Decoder) -> (Vec<String>, usize) {
    let entries = decoder.dynamic.iter();
    let entries = entries.map(|e| format!("{}: {}", text(e.name()), text(e.value())));
    (entries.collect(), decoder.size)
}

fn error(decoder: &mut Decoder, block: &[u8]) -> &'static str {
    fields(decoder, block).unwrap_err().0
}

const REQUEST_1: [&str; 4] = [
    ":method: GET",
    ":scheme: http",
    ":path: /",
    ":authority: www.example.com",
];
const REQUEST_3: [&str; 5] = [
    ":method: GET",
    ":scheme: https",
    ":path: /index.html",
    ":authority: www.example.com",
    "custom-key: custom-value",
];

#[test]
fn c2_literal_and_indexed_fields() {
    let mut decoder = Decoder::new(4096);
    let block = hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572");
    assert_eq!(
        fields(&mut decoder, &block).unwrap(),
        ["custom-key: custom-header"]
    );
    assert_eq!(
        table(&decoder),
        (vec!["custom-key: custom-header".into()], 55)
    );

    let mut decoder = Decoder::new(4096);
    let block = hex("040c 2f73 616d 706c 652f 7061 7468");
    assert_eq!(
        fields(&mut decoder, &block).unwrap(),
        [":path: /sample/path"]
    );
    assert_eq!(table(&decoder), (vec![], 0));

    let block = hex("1008 7061 7373 776f 7264 0673 6563 7265 74");
    assert_eq!(fields(&mut decoder, &block).unwrap(), ["password: secret"]);
    assert_eq!(table(&decoder), (vec![], 0));

    assert_eq!(fields(&mut decoder, &[0x82]).unwrap(), [":method: GET"]);
    assert_eq!(table(&decoder), (vec![], 0));
}

/// C.3 (raw strings) and C.4 (the same requests Huffman-coded) leave the same tables.
fn requests(blocks: [&str; 3]) {
    let mut decoder = Decoder::new(4096);
    assert_eq!(fields(&mut decoder, &hex(blocks[0])).unwrap(), REQUEST_1);
    let authority = ":authority: www.example.com".to_string();
    assert_eq!(table(&decoder), (vec![authority.clone()], 57));

    let mut request_2 = REQUEST_1.to_vec();
    request_2.push("cache-control: no-cache");
    assert_eq!(fields(&mut decoder, &hex(blocks[1])).unwrap(), request_2);
    let cache = "cache-control: no-cache".to_string();
    let expected = vec![cache.clone(), authority.clone()];
    assert_eq!(table(&decoder), (expected, 110));

    assert_eq!(fields(&mut decoder, &hex(blocks[2])).unwrap(), REQUEST_3);
    let expected = vec!["custom-key: custom-value".into(), cache, authority];
    assert_eq!(table(&decoder), (expected, 164));
}

#[test]
fn c3_requests_without_huffman() {
    requests([
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ]);
}

#[test]
fn c4_requests_with_huffman() {
    requests([
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ]);
}

/// C.5 (raw strings) and C.6 (Huffman): responses through a 256-byte table, with evictions.
fn responses(blocks: [&str; 3]) {
    let mut decoder = Decoder::new(256);
    let (date_1, date_2) = (
        "Mon, 21 Oct 2013 20:13:21 GMT",
        "Mon, 21 Oct 2013 20:13:22 GMT",
    );
    let location = "location: https://www.example.com".to_string();
    let date = format!("date: {date_1}");
    let private = "cache-control: private".to_string();
    let response_1 = [":status: 302", &private, &date, &location];
    assert_eq!(fields(&mut decoder, &hex(blocks[0])).unwrap(), response_1);
    let expected = vec![
        location.clone(),
        date.clone(),
        private.clone(),
        ":status: 302".into(),
    ];
    assert_eq!(table(&decoder), (expected, 222));

    let response_2 = [":status: 307", &private, &date, &location];
    assert_eq!(fields(&mut decoder, &hex(blocks[1])).unwrap(), response_2);
    let expected = vec![
        ":status: 307".into(),
        location.clone(),
        date,
        private.clone(),
    ];
    assert_eq!(table(&decoder), (expected, 222));

    let cookie = "set-cookie: foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
    let date = format!("date: {date_2}");
    let response_3 = [
        ":status: 200",
        &private,
        &date,
        &location,
        "content-encoding: gzip",
        cookie,
    ];
    assert_eq!(fields(&mut decoder, &hex(blocks[2])).unwrap(), response_3);
    let expected = vec![cookie.into(), "content-encoding: gzip".into(), date];
    assert_eq!(table(&decoder), (expected, 215));
}

#[test]
fn c5_responses_without_huffman() {
    responses([
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
         2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
         6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
         54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
         5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
         3d31",
    ]);
}

#[test]
fn c6_responses_with_huffman() {
    responses([
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 \
         2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab \
         77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f \
         9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ]);
}

#[test]
fn size_updates_come_first_and_stay_within_the_limit() {
    let mut decoder = Decoder::new(4096);
    fields(
        &mut decoder,
        &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
    )
    .unwrap();
    fields(&mut decoder, &hex("8286 84be 5808 6e6f 2d63 6163 6865")).unwrap();
    assert_eq!(table(&decoder).1, 110);
    // Two updates, then a field: down to 60 (the older entry goes), then back up to 4096.
    let mut block = BytesMut::new();
    encode_int(60, 5, 0x20, &mut block);
    encode_int(4096, 5, 0x20, &mut block);
    block.put_u8(0xbe);
    assert_eq!(
        fields(&mut decoder, &block).unwrap(),
        ["cache-control: no-cache"]
    );
    assert_eq!(
        table(&decoder),
        (vec!["cache-control: no-cache".into()], 53)
    );
    // Down to 0 empties the table.
    fields(&mut decoder, &[0x20]).unwrap();
    assert_eq!(table(&decoder), (vec![], 0));

    let late = "dynamic table size update after a field";
    assert_eq!(error(&mut decoder, &[0x82, 0x20]), late);
    let mut block = BytesMut::new();
    encode_int(4097, 5, 0x20, &mut block);
    assert_eq!(
        error(&mut decoder, &block),
        "dynamic table size update over the limit"
    );
}

#[test]
fn an_entry_larger_than_the_table_empties_it() {
    let mut decoder = Decoder::new(64);
    fields(&mut decoder, &hex("4108 0102 0304 0506 0708")).unwrap();
    assert_eq!(table(&decoder).1, 10 + 8 + 32);
    // A name from the entry about to be evicted: copied before, still right.
    let mut block = BytesMut::new();
    block.put_u8(0x7e);
    encode_string(b"0123456789abcdef", &mut block);
    let mut seen = Vec::new();
    decoder
        .decode(&block, usize::MAX, |n, v| {
            seen.push((n.to_vec(), v.to_vec()))
        })
        .unwrap();
    assert_eq!(
        seen,
        [(b":authority".to_vec(), b"0123456789abcdef".to_vec())]
    );
    assert_eq!(table(&decoder).1, 10 + 16 + 32);
    // 10 + 23 + 32 > 64: nothing stays.
    let mut block = BytesMut::new();
    block.put_u8(0x41);
    encode_string(b"0123456789abcdef0123456", &mut block);
    fields(&mut decoder, &block).unwrap();
    assert_eq!(table(&decoder), (vec![], 0));
}

#[test]
fn rejects_bad_indices_integers_and_strings() {
    let mut decoder = Decoder::new(4096);
    assert_eq!(error(&mut decoder, &[0x80]), "header table index 0");
    assert_eq!(
        error(&mut decoder, &[0xbe]),
        "header table index beyond the table"
    );
    // A literal whose name index is past the (empty) dynamic table.
    assert_eq!(
        error(&mut decoder, &[0x7f, 0x00, 0x00]),
        "header table index beyond the table"
    );
    assert_eq!(error(&mut decoder, &[0xff]), "truncated integer");
    assert_eq!(error(&mut decoder, &[0xff, 0x80]), "truncated integer");
    assert_eq!(error(&mut decoder, &[0x00]), "truncated integer");
    let over = "integer over 2^28";
    assert_eq!(
        error(&mut decoder, &[0xff, 0x80, 0x80, 0x80, 0x80, 0x01]),
        over
    );
    assert_eq!(
        error(&mut decoder, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
        over
    );
    // The largest four continuation bytes carry is fine (and then too large an index).
    let block = [0xff, 0xff, 0xff, 0xff, 0x7f];
    assert_eq!(
        error(&mut decoder, &block),
        "header table index beyond the table"
    );
    let long = "string literal longer than the block";
    assert_eq!(error(&mut decoder, &[0x00, 0x05, b'a']), long);
    assert_eq!(
        error(
            &mut decoder,
            &[0x00, 0x01, b'a', 0x7f, 0xff, 0xff, 0xff, 0x7f]
        ),
        long
    );
    assert_eq!(
        error(&mut decoder, &[0x00, 0x84, 0xff, 0xff, 0xff, 0xff]),
        "EOS in a Huffman string"
    );
    assert_eq!(
        error(&mut decoder, &[0x0f, 0x10, 0x81, 0x00]),
        "Huffman padding not all ones"
    );
    assert_eq!(
        error(&mut decoder, &[0x0f, 0x10, 0x81, 0xff]),
        "Huffman padding longer than 7 bits"
    );
    assert_eq!(table(&decoder), (vec![], 0));
}

#[test]
fn an_oversized_list_keeps_the_table_in_step() {
    let mut decoder = Decoder::new(4096);
    // :method GET (42), then custom-key: custom-value indexed (54), then :path / (38).
    let block = hex("82 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65 84");
    let mut seen = Vec::new();
    let decoded = decoder.decode(&block, 42 + 53, |n, v| {
        seen.push(format!("{}: {}", text(n), text(v)))
    });
    assert_eq!(
        decoded,
        Ok(Decoded {
            oversized: true,
            malformed: None
        })
    );
    assert_eq!(seen, [":method: GET"]);
    assert_eq!(
        table(&decoder),
        (vec!["custom-key: custom-value".into()], 54)
    );
    // The next block refers to the entry the oversized one added.
    assert_eq!(
        fields(&mut decoder, &[0xbe]).unwrap(),
        ["custom-key: custom-value"]
    );
    // Exactly at the bound is not over.
    let decoded = decoder.decode(&block[..1], 42, |_, _| ()).unwrap();
    assert!(!decoded.oversized);
}

#[test]
fn encoded_fields_round_trip() {
    let mut out = BytesMut::new();
    encode_literal_indexed_name(8, b"200", &mut out); // :status
    encode_literal_indexed_name(31, b"application/grpc", &mut out); // content-type
    encode_literal(b"grpc-status", b"0", &mut out);
    let long_value = vec![b'x'; 300];
    encode_literal(b"grpc-message", &long_value, &mut out);
    let mut decoder = Decoder::new(4096);
    let long = format!("grpc-message: {}", "x".repeat(300));
    assert_eq!(
        fields(&mut decoder, &out).unwrap(),
        [
            ":status: 200",
            "content-type: application/grpc",
            "grpc-status: 0",
            &long
        ]
    );
    assert_eq!(table(&decoder), (vec![], 0));
}

#[test]
fn integers_round_trip() {
    for prefix in 1..=8u8 {
        for value in [
            0,
            1,
            30,
            31,
            126,
            127,
            128,
            254,
            255,
            256,
            1 << 14,
            (1 << 28) - 1,
        ] {
            let mut out = BytesMut::new();
            encode_int(value, prefix, 0xff, &mut out);
            let flags = if prefix == 8 { 0 } else { 0xff << prefix };
            assert_eq!(out[0] & flags, flags, "flags kept");
            let mut input = Input {
                block: &out,
                pos: 0,
            };
            assert_eq!(
                input.int(prefix),
                Ok(value),
                "{value} with a {prefix}-bit prefix"
            );
            assert_eq!(input.pos, out.len());
        }
    }
}

#[test]
fn random_blocks_never_panic() {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut decoder = Decoder::new(256);
    for round in 0..20_000 {
        let len = (next() % 48) as usize;
        let mut block: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 3 == 0 {
            // Well-formed prefixes more often: a literal with indexing and a short raw name.
            block.splice(0..0, [0x40, 0x03, b'a', b'b', b'c']);
        }
        let max_list = (next() % 512) as usize;
        let _ = decoder.decode(&block, max_list, |_, _| ());
        let sizes: usize = decoder.dynamic.iter().map(Entry::size).sum();
        assert_eq!(decoder.size, sizes);
        assert!(decoder.size <= decoder.max_size && decoder.max_size <= 256);
    }
}

/// A malformed field (RFC 9113 8.2.1) is found when it is a literal and again each time a
/// block names its dynamic table entry; static entries and valid literals are not.
#[test]
fn malformed_fields_are_found_in_literals_and_their_table_entries() {
    let mut decoder = Decoder::new(4096);
    let decode = |decoder: &mut Decoder, block: &[u8]| {
        decoder
            .decode(block, usize::MAX, |_, _| ())
            .expect("decodes")
            .malformed
    };
    // `:method: POST` (static 3), then `x-a: b` with incremental indexing: valid.
    let mut block = vec![0x83, 0x40, 3];
    block.extend_from_slice(b"x-a");
    block.push(1);
    block.extend_from_slice(b"b");
    assert_eq!(decode(&mut decoder, &block), None);
    // `x-b: a\r\nc` with incremental indexing: malformed, and so is its entry (now 62).
    let mut block = vec![0x40, 3];
    block.extend_from_slice(b"x-b");
    block.push(4);
    block.extend_from_slice(b"a\r\nc");
    assert!(decode(&mut decoder, &block).is_some());
    assert!(decode(&mut decoder, &[0x80 | 62]).is_some(), "the entry");
    assert_eq!(decode(&mut decoder, &[0x80 | 63]), None, "the valid entry");
    // Upper case in a literal name.
    let mut block = vec![0x00, 3];
    block.extend_from_slice(b"X-c");
    block.push(1);
    block.extend_from_slice(b"v");
    assert!(decode(&mut decoder, &block).is_some());
}
