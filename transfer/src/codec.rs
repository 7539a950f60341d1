//! The primitives every frame is made of: little-endian integers and length-prefixed byte
//! strings, each length checked against its own bound before anything is allocated, so a
//! peer's bytes can never make the decoder allocate more than the bound of what it claims.

use crate::Error;

/// Appends primitives to a buffer.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u128(&mut self, v: u128) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// A byte string, its length first (u32). The caller has checked it against the bound
    /// the decoder will apply: [`Reader::bytes`] refuses anything longer.
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
    }
}

/// Reads primitives from a frame's payload; every read is bounds-checked.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(payload: &'a [u8]) -> Self {
        Self { rest: payload }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Error> {
        if self.rest.len() < n {
            return Err(Error::Truncated(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Error> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, Error> {
        Ok(self.take(1, what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, Error> {
        self.array(what).map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, Error> {
        self.array(what).map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, Error> {
        self.array(what).map(u64::from_le_bytes)
    }
    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, Error> {
        self.array(what).map(i64::from_le_bytes)
    }
    pub(crate) fn u128(&mut self, what: &'static str) -> Result<u128, Error> {
        self.array(what).map(u128::from_le_bytes)
    }

    /// A byte string of at most `max` bytes, borrowed from the payload (nothing allocated).
    pub(crate) fn bytes(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], Error> {
        let len = self.u32(what)? as usize;
        Error::at_most(what, len, max)?;
        self.take(len, what)
    }

    /// A count of items that each take at least `min_size` bytes: refused if more than `max`
    /// or if the payload left could not hold them, so a claimed count never sizes an
    /// allocation beyond what the frame really carries.
    pub(crate) fn count(
        &mut self,
        max: usize,
        min_size: usize,
        what: &'static str,
    ) -> Result<usize, Error> {
        let n = self.u32(what)? as usize;
        Error::few_enough(what, n, max)?;
        if n.saturating_mul(min_size.max(1)) > self.rest.len() {
            return Err(Error::Truncated(what));
        }
        Ok(n)
    }

    /// The payload must be used up: trailing bytes mean the peer and we disagree on the
    /// frame's layout.
    pub(crate) fn finish(self, what: &'static str) -> Result<(), Error> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(Error::Trailing { what, n }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip_little_endian() {
        let mut w = Writer::default();
        w.u8(7);
        w.u16(0x0102);
        w.u32(0x0304_0506);
        w.u64(u64::MAX - 1);
        w.i64(-5);
        w.u128(1 << 100);
        assert_eq!(&w.buf[1..3], &[0x02, 0x01]);
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.u8("a"), Ok(7));
        assert_eq!(r.u16("b"), Ok(0x0102));
        assert_eq!(r.u32("c"), Ok(0x0304_0506));
        assert_eq!(r.u64("d"), Ok(u64::MAX - 1));
        assert_eq!(r.i64("e"), Ok(-5));
        assert_eq!(r.u128("f"), Ok(1 << 100));
        assert_eq!(r.finish("x"), Ok(()));
    }

    #[test]
    fn a_length_over_its_bound_is_refused_before_reading() {
        let mut w = Writer::default();
        w.bytes(&[1; 10]);
        let mut r = Reader::new(&w.buf);
        assert_eq!(
            r.bytes(9, "name"),
            Err(Error::TooLong {
                what: "name",
                len: 10,
                max: 9
            })
        );
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.bytes(10, "name"), Ok(&[1u8; 10][..]));
    }

    #[test]
    fn a_count_the_payload_cannot_hold_is_refused() {
        let mut w = Writer::default();
        w.u32(1000);
        w.buf.extend_from_slice(&[0; 100]);
        let mut r = Reader::new(&w.buf);
        assert_eq!(
            r.count(5000, 8, "entries"),
            Err(Error::Truncated("entries"))
        );
        let mut r = Reader::new(&w.buf);
        assert_eq!(
            r.count(10, 0, "entries"),
            Err(Error::TooMany {
                what: "entries",
                n: 1000,
                max: 10
            })
        );
    }

    #[test]
    fn truncated_and_trailing_bytes_are_errors() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u32("size"), Err(Error::Truncated("size")));
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16("a"), Ok(0x0201));
        assert_eq!(
            r.finish("frame"),
            Err(Error::Trailing {
                what: "frame",
                n: 1
            })
        );
    }
}
