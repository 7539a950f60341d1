//! Fuzz the transfer protocol's decoder with a peer's arbitrary bytes: it must never panic
//! or allocate past its bounds, and whatever it accepts must encode back to the same
//! bytes (one encoding per frame: no two readings of one input). Run: `make fuzz`.
#![no_main]

use ferry_transfer::frame::{Frame, HEADER};
use ferry_transfer::stream::check_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((header, payload)) = data.split_first_chunk::<HEADER>() else {
        return;
    };
    let Ok((kind, len)) = check_header(*header) else {
        return;
    };
    let Some(payload) = payload.get(..len) else {
        return;
    };
    if let Ok(frame) = Frame::decode(kind, payload) {
        let mut again = Vec::new();
        frame.encode(&mut again).expect("a decoded frame encodes");
        assert_eq!(&again[..HEADER], &header[..], "header differs");
        assert_eq!(&again[HEADER..], payload, "payload differs");
    }
});
