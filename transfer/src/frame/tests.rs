//! The frame codec's tests: every kind of frame round-trips, and every bound, truncation
//! and malformed field a peer could send is refused before anything is allocated for it.

use super::*;
use crate::entry::tests::sample;
use crate::entry::{Kind, Time, Xattr, XATTR_BYTES_MAX, XATTR_VALUE_MAX};
use crate::stream::{check_header, read_frame, write_data, write_frame, DATA_PREFIX};
use std::io;

fn small(name: &[u8], data: &[u8]) -> Entry {
    Entry {
        size: data.len() as u64,
        ..sample(name, Kind::Regular)
    }
}

fn every_kind() -> Vec<Frame> {
    let t = Time {
        secs: -1,
        nanos: 999_999_999,
    };
    vec![
        Frame::Hello {
            version: VERSION,
            job: b"0b5e2c1e-6a4c-4a5e-9d51-1f0e7c9c2d10".to_vec(),
            shard: 2,
            epoch: 7,
            ticket: [0xab; 32],
        },
        Frame::ExportHello(ExportHello {
            version: VERSION,
            export: b"3e4f5a6b-7c8d-4e9f-8a0b-1c2d3e4f5a6b".to_vec(),
            credential: [0xcd; 32],
            job: b"0b5e2c1e-6a4c-4a5e-9d51-1f0e7c9c2d10".to_vec(),
            namespace: b"shop-dr".to_vec(),
            shard: 2,
            epoch: 7,
            path: b"db".to_vec(),
            bandwidth_limit: 4 << 20,
        }),
        Frame::Welcome { version: VERSION },
        Frame::Refused {
            reason: "ticket is not this shard's".into(),
        },
        Frame::Stat {
            req: 1,
            path: vec![],
        },
        Frame::Entry {
            req: 1,
            entry: sample(b"top", Kind::Directory),
        },
        Frame::List {
            req: 2,
            path: b"a/b c/\xff".to_vec(),
            ino: 77,
            inline: true,
            hash: false,
            attrs: true,
        },
        Frame::List {
            req: 3,
            path: b"kept".to_vec(),
            ino: 78,
            inline: false,
            hash: true,
            attrs: false,
        },
        Frame::Listing {
            req: 2,
            entries: vec![
                small(b"f", b"hello"),
                sample(b"d", Kind::Directory),
                sample(b"l", Kind::Symlink(b"/etc/shadow".to_vec())),
                small(b"g", b""),
            ],
            inline: vec![
                Inline {
                    index: 0,
                    data: Bytes::from_static(b"hello"),
                    hash: Some(5),
                },
                Inline {
                    index: 3,
                    data: Bytes::new(),
                    hash: None,
                },
            ],
            last: true,
        },
        Frame::Listing {
            req: 0,
            entries: vec![],
            inline: vec![],
            last: false,
        },
        Frame::More { req: 2 },
        Frame::Read {
            req: 3,
            path: b"a/f".to_vec(),
            expect: Fingerprint {
                ino: 9,
                size: 1 << 40,
                mtime: t,
                ctime: Time::default(),
            },
            credit: 8 << 20,
            hash: true,
            hash_only: false,
            zstd: true,
        },
        Frame::Data {
            req: 3,
            offset: 1 << 40,
            zstd: false,
            data: vec![1, 2, 3].into(),
        },
        Frame::Data {
            req: 3,
            offset: 0,
            zstd: true,
            data: vec![0x28, 0xb5, 0x2f, 0xfd].into(),
        },
        Frame::FileEnd {
            req: 3,
            len: 1 << 40,
            hash: Some(u128::MAX - 3),
            changed: false,
        },
        Frame::FileEnd {
            req: 3,
            len: 0,
            hash: None,
            changed: true,
        },
        Frame::Credit {
            req: 3,
            bytes: 8 << 20,
        },
        Frame::Failed {
            req: 4,
            errno: 2, // ENOENT
            message: "no such file".into(),
        },
        Frame::Close { req: 4 },
        Frame::Abort {
            reason: "destination full".into(),
        },
        Frame::Count {
            req: 5,
            links: true,
        },
        Frame::Count {
            req: 6,
            links: false,
        },
        Frame::Counted {
            req: 5,
            files: u64::MAX,
            bytes: 1 << 50,
        },
        Frame::Counted {
            req: 6,
            files: 0,
            bytes: 0,
        },
        Frame::ReadRange {
            req: 7,
            offset: 1 << 40,
            len: MAX_RANGE,
            hash_only: false,
            zstd: true,
        },
        Frame::ReadRange {
            req: 8,
            offset: 0,
            len: 1,
            hash_only: true,
            zstd: false,
        },
        Frame::HashChunks {
            req: 9,
            path: b"big/disk.img".to_vec(),
            expect: Fingerprint {
                ino: 4,
                size: 1 << 36,
                mtime: t,
                ctime: t,
            },
            shift: CHUNK_SHIFT_MAX,
        },
        Frame::ChunkHashes {
            req: 9,
            shift: CHUNK_SHIFT_MIN,
            hashes: vec![0, u128::MAX, 7],
        },
        Frame::ChunkHashes {
            req: 9,
            shift: 20,
            hashes: vec![],
        },
        Frame::ReadPart {
            req: 10,
            path: b"big/disk.img".to_vec(),
            expect: Fingerprint {
                ino: 4,
                size: 1 << 36,
                mtime: t,
                ctime: t,
            },
            offset: 3 << 20,
            len: 2 << 20,
            credit: 8 << 20,
            zstd: true,
        },
    ]
}

#[test]
fn chunk_sizes_and_counts_and_parts_are_bounded_both_ways() {
    let expect = Fingerprint {
        ino: 1,
        size: 1,
        mtime: Time::default(),
        ctime: Time::default(),
    };
    let refused = [
        Frame::HashChunks {
            req: 1,
            path: vec![],
            expect,
            shift: CHUNK_SHIFT_MIN - 1,
        },
        Frame::HashChunks {
            req: 1,
            path: vec![],
            expect,
            shift: CHUNK_SHIFT_MAX + 1,
        },
        Frame::ChunkHashes {
            req: 1,
            shift: 20,
            hashes: vec![0; MAX_CHUNKS + 1],
        },
        Frame::ReadPart {
            req: 1,
            path: vec![],
            expect,
            offset: 0,
            len: 0,
            credit: 0,
            zstd: false,
        },
        Frame::ReadPart {
            req: 1,
            path: vec![],
            expect,
            offset: u64::MAX - 5,
            len: 10,
            credit: 0,
            zstd: false,
        },
    ];
    for f in refused {
        assert!(f.encode(&mut Vec::new()).is_err(), "sent: {f:?}");
    }
    // The most chunk hashes fit one frame; a peer claiming more is refused before anything
    // is allocated for them.
    let most = Frame::ChunkHashes {
        req: 1,
        shift: 20,
        hashes: vec![u128::MAX; MAX_CHUNKS],
    };
    let mut buf = Vec::new();
    most.encode(&mut buf).expect("the most chunk hashes");
    assert_eq!(Frame::decode(20, &buf[HEADER..]).expect("decoded"), most);
    let mut payload = Vec::new();
    payload.extend_from_slice(&1u32.to_le_bytes());
    payload.push(20);
    payload.extend_from_slice(&(MAX_CHUNKS as u32 + 1).to_le_bytes());
    let e = Frame::decode(20, &payload).expect_err("too many");
    assert!(
        matches!(e, Error::TooMany { .. } | Error::Truncated(_)),
        "{e}"
    );
    // A shift outside the bounds, received.
    let mut payload = Vec::new();
    payload.extend_from_slice(&1u32.to_le_bytes());
    payload.push(CHUNK_SHIFT_MAX + 1);
    payload.extend_from_slice(&0u32.to_le_bytes());
    assert!(Frame::decode(20, &payload).is_err());
}

#[test]
fn a_range_is_not_empty_not_longer_than_a_chunk_and_inside_a_device() {
    for (offset, len) in [(0, 0), (0, MAX_RANGE + 1), (u64::MAX - 5, 10)] {
        let f = Frame::ReadRange {
            req: 1,
            offset,
            len,
            hash_only: false,
            zstd: false,
        };
        assert!(f.encode(&mut Vec::new()).is_err(), "sent: {offset} {len}");
        // A peer that sends one anyway is refused on decode.
        let mut payload = Vec::new();
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&offset.to_le_bytes());
        payload.extend_from_slice(&len.to_le_bytes());
        payload.extend_from_slice(&[0, 0]);
        assert!(
            Frame::decode(18, &payload).is_err(),
            "received: {offset} {len}"
        );
    }
}

#[test]
fn every_frame_round_trips_through_a_stream() {
    let frames = every_kind();
    // Every kind is here, so the round trip and truncation tests cover each decoder;
    // the next kind byte is unknown.
    let kinds: std::collections::BTreeSet<u8> = frames.iter().map(Frame::kind).collect();
    assert_eq!(kinds, (1..=22).collect());
    assert!(matches!(
        Frame::decode(23, &[]),
        Err(Error::Unknown {
            what: "frame kind",
            tag: 23
        })
    ));
    let mut wire = Vec::new();
    let mut buf = Vec::new();
    for f in &frames {
        write_frame(&mut wire, f, &mut buf).expect("encode");
    }
    let mut r = &wire[..];
    for f in &frames {
        assert_eq!(&read_frame(&mut r, &mut buf).expect("decode"), f);
    }
    let end = read_frame(&mut r, &mut buf).expect_err("end");
    assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof);
}

#[test]
fn a_header_claiming_more_than_the_bound_is_refused_before_reading() {
    let mut header = [7u8, 0, 0, 0, 0];
    header[1..].copy_from_slice(&((MAX_PAYLOAD + 1) as u32).to_le_bytes());
    assert!(matches!(
        check_header(header),
        Err(Error::FrameTooLarge { .. })
    ));
    // read_frame refuses it without waiting for (or allocating) the payload.
    let mut buf = Vec::new();
    let err = read_frame(&mut &header[..], &mut buf).expect_err("too large");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(buf.capacity() < MAX_PAYLOAD);
}

#[test]
fn every_truncation_of_every_frame_is_refused() {
    for f in every_kind() {
        let mut wire = Vec::new();
        f.encode(&mut wire).expect("encode");
        let payload = &wire[HEADER..];
        for cut in 0..payload.len() {
            assert!(
                Frame::decode(wire[0], &payload[..cut]).is_err(),
                "{f:?} cut at {cut} decoded"
            );
        }
        let mut longer = payload.to_vec();
        longer.push(0);
        assert!(
            matches!(Frame::decode(wire[0], &longer), Err(Error::Trailing { .. })),
            "{f:?} with a trailing byte"
        );
    }
}

#[test]
fn request_paths_must_be_relative_components() {
    for path in [
        &b"/abs"[..],
        b"a//b",
        b"a/",
        b"../x",
        b"a/./b",
        b"a/\0",
        b"..",
    ] {
        let f = Frame::Stat {
            req: 0,
            path: path.to_vec(),
        };
        assert!(f.encode(&mut Vec::new()).is_err(), "{path:?} encoded");
        // Encoded by hand, as a hostile receiver would.
        let mut w = Writer::default();
        w.u32(0);
        w.bytes(path);
        assert!(
            matches!(Frame::decode(4, &w.buf), Err(Error::Invalid { .. })),
            "{path:?} decoded"
        );
    }
}

#[test]
fn a_count_larger_than_the_frame_allocates_nothing() {
    let mut w = Writer::default();
    w.u32(0);
    w.u32(MAX_ENTRIES as u32);
    assert_eq!(Frame::decode(7, &w.buf), Err(Error::Truncated("entries")));
    let mut w = Writer::default();
    w.u32(0);
    w.u32(u32::MAX);
    assert!(matches!(
        Frame::decode(7, &w.buf),
        Err(Error::TooMany { .. })
    ));
}

#[test]
fn inline_files_must_be_whole_regular_entries_of_their_listing_in_order() {
    let entries = vec![small(b"f", b"abc"), sample(b"d", Kind::Directory)];
    let listing = |inline: Vec<Inline>| Frame::Listing {
        req: 0,
        entries: entries.clone(),
        inline,
        last: true,
    };
    let one = |index: u32, data: &[u8]| Inline {
        index,
        data: Bytes::copy_from_slice(data),
        hash: None,
    };
    for (inline, why) in [
        (vec![one(2, b"abc")], "an index past the listing"),
        (vec![one(1, b"")], "a directory"),
        (vec![one(0, b"ab")], "shorter than its file"),
        (vec![one(0, b"abc"), one(0, b"abc")], "the same file twice"),
    ] {
        let f = listing(inline);
        assert!(f.encode(&mut Vec::new()).is_err(), "encoded: {why}");
        // The same bytes made without the check, as a hostile sender would.
        let Frame::Listing { inline, .. } = &f else {
            unreachable!()
        };
        let mut w = Writer::default();
        w.u32(0);
        w.u32(entries.len() as u32);
        entries.iter().for_each(|e| e.encode(&mut w));
        w.u32(inline.len() as u32);
        for i in inline {
            w.u32(i.index);
            w.bytes(&i.data);
            w.u8(0);
        }
        w.u8(1);
        assert!(Frame::decode(7, &w.buf).is_err(), "decoded: {why}");
    }
    assert!(listing(vec![one(0, b"abc")])
        .encode(&mut Vec::new())
        .is_ok());
}

#[test]
fn the_largest_entry_fits_one_listing_with_the_most_inline_data() {
    let mut e = sample(&[b'n'; 255], Kind::Symlink(vec![b't'; 4095]));
    let per = XATTR_VALUE_MAX;
    let n = (XATTR_BYTES_MAX - 8 * 255) / per;
    e.xattrs = (0..n)
        .map(|i| Xattr {
            name: format!("user.{i:0>250}").into_bytes(),
            value: vec![7; per],
        })
        .collect();
    e.check().expect("within the per-entry bound");
    let files = INLINE_BYTES / INLINE_MAX;
    let mut entries = vec![e];
    entries.extend((0..files).map(|i| small(format!("f{i}").as_bytes(), &[1; INLINE_MAX])));
    let inline = (1..=files as u32)
        .map(|index| Inline {
            index,
            data: vec![1; INLINE_MAX].into(),
            hash: Some(1),
        })
        .collect();
    let f = Frame::Listing {
        req: 1,
        entries,
        inline,
        last: false,
    };
    let mut wire = Vec::new();
    f.encode(&mut wire).expect("fits");
    assert_eq!(Frame::decode(wire[0], &wire[HEADER..]), Ok(f));
}

#[test]
fn oversized_fields_are_refused_when_sent_and_when_received() {
    let data = Frame::Data {
        req: 0,
        offset: 0,
        zstd: false,
        data: vec![0; MAX_DATA + 1].into(),
    };
    assert!(data.encode(&mut Vec::new()).is_err());
    let mut w = Writer::default();
    w.u32(0);
    w.u64(u64::MAX);
    w.u8(0);
    w.bytes(&[1]);
    assert!(
        matches!(Frame::decode(10, &w.buf), Err(Error::Invalid { .. })),
        "an offset that overflows"
    );
    assert!(matches!(
        Frame::decode(42, &[]),
        Err(Error::Unknown { tag: 42, .. })
    ));
    let long = "é".repeat(REASON_MAX);
    let mut wire = Vec::new();
    Frame::Abort { reason: long }
        .encode(&mut wire)
        .expect("cut");
    match Frame::decode(wire[0], &wire[HEADER..]) {
        Ok(Frame::Abort { reason }) => assert!(reason.len() <= REASON_MAX),
        other => panic!("{other:?}"),
    }
    // A flag is 0 or 1.
    let mut w = Writer::default();
    w.u32(0);
    w.bytes(b"");
    w.u64(0);
    w.u8(2);
    w.u8(0);
    assert!(matches!(
        Frame::decode(6, &w.buf),
        Err(Error::Unknown { what: "inline", .. })
    ));
    let mut w = Writer::default();
    w.u32(0);
    w.u8(2);
    assert!(matches!(
        Frame::decode(16, &w.buf),
        Err(Error::Unknown { what: "links", .. })
    ));
}

#[test]
fn data_frames_are_written_from_a_slice_and_read_into_their_own_buffer_as_any_frame() {
    for (req, offset, zstd, len) in [
        (3u32, 0u64, false, 0usize),
        (9, 1 << 40, true, 5),
        (1, 7, false, MAX_DATA),
    ] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
        let frame = Frame::Data {
            req,
            offset,
            zstd,
            data: data.clone().into(),
        };
        let mut framed = Vec::new();
        write_frame(&mut framed, &frame, &mut Vec::new()).expect("write_frame");
        let mut sliced = Vec::new();
        write_data(&mut sliced, (req, offset, zstd), &data).expect("write_data");
        assert_eq!(sliced, framed, "{len} bytes");
        let read = read_frame(&mut sliced.as_slice(), &mut Vec::new()).expect("read");
        assert_eq!(read, frame);
        // Cut anywhere: an error, never a frame.
        for cut in [1, HEADER + 3, HEADER + DATA_PREFIX, sliced.len() - 1] {
            if cut < sliced.len() {
                assert!(
                    read_frame(&mut &sliced[..cut], &mut Vec::new()).is_err(),
                    "cut at {cut}"
                );
            }
        }
        // A payload longer than its data says: refused as a trailing byte.
        let mut long = sliced.clone();
        long.push(0);
        let plen = u32::from_le_bytes([long[1], long[2], long[3], long[4]]) + 1;
        long[1..5].copy_from_slice(&plen.to_le_bytes());
        let e = read_frame(&mut long.as_slice(), &mut Vec::new()).expect_err("trailing");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
    // A compression flag other than 0 or 1, and an offset that overflows with the length.
    let mut bad = Vec::new();
    write_data(&mut bad, (1, 0, false), b"xyz").expect("write");
    bad[HEADER + 12] = 2;
    assert!(read_frame(&mut bad.as_slice(), &mut Vec::new()).is_err());
    let mut over = Vec::new();
    write_data(&mut over, (1, u64::MAX - 1, false), b"xyz").expect("write");
    assert!(read_frame(&mut over.as_slice(), &mut Vec::new()).is_err());
    assert!(write_data(&mut Vec::new(), (1, 0, false), &vec![0; MAX_DATA + 1]).is_err());
}

// The peering port's first frame (export_hello.rs).
fn hello() -> ExportHello {
    ExportHello {
        version: crate::frame::VERSION,
        export: b"3e4f5a6b-7c8d-4e9f-8a0b-1c2d3e4f5a6b".to_vec(),
        credential: [7; 32],
        job: b"9a2b7c4d-1e3f-4a5b-8c6d-7e8f9a0b1c2d".to_vec(),
        namespace: b"shop-dr".to_vec(),
        shard: 3,
        epoch: 2,
        path: b"db/2026".to_vec(),
        bandwidth_limit: 0,
    }
}

#[test]
fn an_export_hello_round_trips_and_never_prints_its_credential() {
    let frame = Frame::ExportHello(hello());
    let mut buf = Vec::new();
    frame.encode(&mut buf).expect("encode");
    let back = Frame::decode(buf[0], &buf[crate::frame::HEADER..]).expect("decode");
    assert_eq!(back, frame);
    assert!(!format!("{back:?}").contains("7, 7"), "{back:?}");
}

#[test]
fn a_path_out_of_the_export_or_an_overlong_field_is_refused_on_both_sides() {
    for bad in [&b"../other"[..], b"a/../../b", b"/etc"] {
        let mut h = hello();
        h.path = bad.to_vec();
        let mut buf = Vec::new();
        assert!(
            Frame::ExportHello(h.clone()).encode(&mut buf).is_err(),
            "{bad:?} encoded"
        );
        // A peer that sends it anyway.
        let mut w = Writer { buf: Vec::new() };
        w.u16(h.version);
        w.bytes(&h.export);
        w.buf.extend_from_slice(&h.credential);
        w.bytes(&h.job);
        w.bytes(&h.namespace);
        w.u32(h.shard);
        w.u64(h.epoch);
        w.bytes(&h.path);
        assert!(
            ExportHello::decode(&mut Reader::new(&w.buf)).is_err(),
            "{bad:?} decoded"
        );
    }
    let mut h = hello();
    h.namespace = vec![b'a'; crate::export_hello::NAMESPACE_MAX + 1];
    assert!(Frame::ExportHello(h).encode(&mut Vec::new()).is_err());
}
