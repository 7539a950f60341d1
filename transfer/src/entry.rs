//! One source entry as the destination half needs it: its name, type, owner, mode, times,
//! hard-link identity and extended attributes; a regular file's data travels separately.
//! Everything here comes from a peer, so decoding checks every field the receiver will hand
//! to a syscall: a name is one path component, a symlink target has no NUL, times have
//! valid nanoseconds, and the sizes of names, targets and attributes stay within the
//! kernel's own limits.

use crate::codec::{Reader, Writer};
use crate::Error;

/// Longest file name (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest symlink target (`PATH_MAX` less its NUL).
pub const TARGET_MAX: usize = 4095;
/// Longest extended attribute name (`XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value (`XATTR_SIZE_MAX`).
pub const XATTR_VALUE_MAX: usize = 65536;
/// Most extended attributes one entry may carry.
pub const XATTRS_MAX: usize = 1024;
/// Most bytes of extended attributes (names and values) one entry may carry: more than any
/// local filesystem keeps on one inode in practice, and what bounds an entry's record.
pub const XATTR_BYTES_MAX: usize = 1 << 20;

/// The smallest an encoded entry can be (for [`Reader::count`]).
pub(crate) const MIN_ENCODED: usize = 4 + 1 + 1 + 4 * 4 + 8 * 4 + 12 * 3 + 4;

/// What kind of entry, with what only that kind has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Regular,
    Directory,
    /// The target, verbatim (never resolved by either side).
    Symlink(Vec<u8>),
    Fifo,
    Socket,
    /// A character device, by `st_rdev`.
    CharDevice(u64),
    BlockDevice(u64),
}

/// A timestamp: seconds since the epoch and nanoseconds (below 10^9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

/// One extended attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// One source entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// One path component: 1 to 255 bytes, no `/` or NUL, not `.` or `..`.
    pub name: Vec<u8>,
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky (`st_mode & 0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    /// Apparent size (regular files; 0 for the others).
    pub size: u64,
    /// 512-byte blocks allocated (`st_blocks`): fewer than the size needs means holes.
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    /// The inode's change time: with size and mtime, what tells the sender that a file
    /// changed since it was listed (it is not applied: no syscall sets it).
    pub ctime: Time,
    /// Names the source has for this inode, and its identity on the source (device,
    /// inode): the receiver links the names of one inode together.
    pub nlink: u32,
    pub dev: u64,
    pub ino: u64,
    pub xattrs: Vec<Xattr>,
}

/// Check a name is one path component the receiver can create beneath a directory.
pub fn check_name(name: &[u8], what: &'static str) -> Result<(), Error> {
    let why = if name.is_empty() {
        "is empty"
    } else if name.len() > NAME_MAX {
        "is longer than 255 bytes"
    } else if name.contains(&b'/') {
        "contains '/'"
    } else if name.contains(&0) {
        "contains a NUL byte"
    } else if name == b"." || name == b".." {
        "is '.' or '..'"
    } else {
        return Ok(());
    };
    Err(Error::Invalid { what, why })
}

fn check_nul_free(v: &[u8], what: &'static str) -> Result<(), Error> {
    match (v.is_empty(), v.contains(&0)) {
        (true, _) => Err(Error::Invalid {
            what,
            why: "is empty",
        }),
        (_, true) => Err(Error::Invalid {
            what,
            why: "contains a NUL byte",
        }),
        _ => Ok(()),
    }
}

impl Kind {
    fn tag(&self) -> u8 {
        match self {
            Kind::Regular => 1,
            Kind::Directory => 2,
            Kind::Symlink(_) => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::CharDevice(_) => 6,
            Kind::BlockDevice(_) => 7,
        }
    }
}

impl Entry {
    /// Refuse what the decoder would refuse, so a sender finds out before it sends (an
    /// entry with more attributes than a record carries fails there, with its name).
    pub fn check(&self) -> Result<(), Error> {
        check_name(&self.name, "entry name")?;
        if let Kind::Symlink(t) = &self.kind {
            Error::at_most("symlink target", t.len(), TARGET_MAX)?;
            check_nul_free(t, "symlink target")?;
        }
        if self.perm & !0o7777 != 0 {
            return Err(Error::Invalid {
                what: "mode",
                why: "has bits outside 0o7777",
            });
        }
        for t in [self.atime, self.mtime, self.ctime] {
            if t.nanos >= 1_000_000_000 {
                return Err(Error::Invalid {
                    what: "timestamp",
                    why: "has nanoseconds of a second or more",
                });
            }
        }
        Error::few_enough("extended attributes", self.xattrs.len(), XATTRS_MAX)?;
        let mut total = 0usize;
        for x in &self.xattrs {
            Error::at_most("extended attribute name", x.name.len(), XATTR_NAME_MAX)?;
            check_nul_free(&x.name, "extended attribute name")?;
            Error::at_most("extended attribute value", x.value.len(), XATTR_VALUE_MAX)?;
            total += x.name.len() + x.value.len();
        }
        Error::at_most("extended attributes of one entry", total, XATTR_BYTES_MAX)?;
        Ok(())
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        w.bytes(&self.name);
        w.u8(self.kind.tag());
        match &self.kind {
            Kind::Symlink(t) => w.bytes(t),
            Kind::CharDevice(r) | Kind::BlockDevice(r) => w.u64(*r),
            _ => {}
        }
        w.u32(self.perm);
        w.u32(self.uid);
        w.u32(self.gid);
        w.u32(self.nlink);
        w.u64(self.size);
        w.u64(self.blocks);
        w.u64(self.dev);
        w.u64(self.ino);
        for t in [self.atime, self.mtime, self.ctime] {
            w.i64(t.secs);
            w.u32(t.nanos);
        }
        w.u32(self.xattrs.len() as u32);
        for x in &self.xattrs {
            w.bytes(&x.name);
            w.bytes(&x.value);
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, Error> {
        let name = r.bytes(NAME_MAX, "entry name")?.to_vec();
        let kind = match r.u8("entry kind")? {
            1 => Kind::Regular,
            2 => Kind::Directory,
            3 => Kind::Symlink(r.bytes(TARGET_MAX, "symlink target")?.to_vec()),
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDevice(r.u64("device number")?),
            7 => Kind::BlockDevice(r.u64("device number")?),
            tag => {
                return Err(Error::Unknown {
                    what: "entry kind",
                    tag,
                })
            }
        };
        let perm = r.u32("mode")?;
        let (uid, gid, nlink) = (r.u32("uid")?, r.u32("gid")?, r.u32("nlink")?);
        let (size, blocks) = (r.u64("size")?, r.u64("blocks")?);
        let (dev, ino) = (r.u64("device")?, r.u64("inode")?);
        let mut time = || -> Result<Time, Error> {
            Ok(Time {
                secs: r.i64("timestamp")?,
                nanos: r.u32("timestamp")?,
            })
        };
        let (atime, mtime, ctime) = (time()?, time()?, time()?);
        // Each attribute is at least its two length prefixes and a byte of name.
        let n = r.count(XATTRS_MAX, 9, "extended attributes")?;
        let mut xattrs = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.bytes(XATTR_NAME_MAX, "extended attribute name")?.to_vec();
            let value = r
                .bytes(XATTR_VALUE_MAX, "extended attribute value")?
                .to_vec();
            xattrs.push(Xattr { name, value });
        }
        let entry = Entry {
            name,
            kind,
            perm,
            uid,
            gid,
            size,
            blocks,
            atime,
            mtime,
            ctime,
            nlink,
            dev,
            ino,
            xattrs,
        };
        entry.check()?;
        Ok(entry)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(name: &[u8], kind: Kind) -> Entry {
        Entry {
            name: name.to_vec(),
            kind,
            perm: 0o4755,
            uid: 1000,
            gid: 2000,
            size: 12345,
            blocks: 24,
            ctime: Time {
                secs: 1_700_000_001,
                nanos: 2,
            },
            atime: Time {
                secs: -5,
                nanos: 999_999_999,
            },
            mtime: Time {
                secs: 1_700_000_000,
                nanos: 1,
            },
            nlink: 2,
            dev: 0x803,
            ino: 77,
            xattrs: vec![
                Xattr {
                    name: b"user.a".to_vec(),
                    value: b"x\0y".to_vec(),
                },
                Xattr {
                    name: b"system.posix_acl_access".to_vec(),
                    value: vec![2, 0, 0, 0],
                },
            ],
        }
    }

    fn round_trip(e: &Entry) -> Result<Entry, Error> {
        let mut w = Writer::default();
        e.encode(&mut w);
        let mut r = Reader::new(&w.buf);
        let got = Entry::decode(&mut r)?;
        r.finish("entry")?;
        Ok(got)
    }

    #[test]
    fn every_kind_round_trips() {
        for kind in [
            Kind::Regular,
            Kind::Directory,
            Kind::Symlink(b"../a b/\xff".to_vec()),
            Kind::Fifo,
            Kind::Socket,
            Kind::CharDevice(0x0105),
            Kind::BlockDevice(u64::MAX),
        ] {
            let e = sample(b"n\xe9\xff \n", kind);
            assert_eq!(round_trip(&e), Ok(e));
        }
    }

    #[test]
    fn names_that_are_not_one_component_are_refused() {
        for (name, why) in [
            (&b""[..], "is empty"),
            (b".", "is '.' or '..'"),
            (b"..", "is '.' or '..'"),
            (b"a/b", "contains '/'"),
            (b"/", "contains '/'"),
            (b"a\0b", "contains a NUL byte"),
        ] {
            let e = sample(name, Kind::Regular);
            assert_eq!(
                round_trip(&e),
                Err(Error::Invalid {
                    what: "entry name",
                    why
                }),
                "{name:?}"
            );
        }
        let long = sample(&[b'a'; 256], Kind::Regular);
        assert!(matches!(round_trip(&long), Err(Error::TooLong { .. })));
        assert!(round_trip(&sample(&[b'a'; 255], Kind::Regular)).is_ok());
    }

    #[test]
    fn bad_targets_modes_times_and_attributes_are_refused() {
        let cases: Vec<(Entry, &str)> = vec![
            (sample(b"l", Kind::Symlink(vec![])), "empty target"),
            (
                sample(b"l", Kind::Symlink(b"a\0b".to_vec())),
                "NUL in target",
            ),
            (
                sample(b"l", Kind::Symlink(vec![b'a'; TARGET_MAX + 1])),
                "long target",
            ),
            (
                Entry {
                    perm: 0o170_000,
                    ..sample(b"f", Kind::Regular)
                },
                "file type bits in the mode",
            ),
            (
                Entry {
                    mtime: Time {
                        secs: 0,
                        nanos: 1_000_000_000,
                    },
                    ..sample(b"f", Kind::Regular)
                },
                "nanoseconds out of range",
            ),
            (
                Entry {
                    xattrs: vec![Xattr {
                        name: b"user.a\0".to_vec(),
                        value: vec![],
                    }],
                    ..sample(b"f", Kind::Regular)
                },
                "NUL in an attribute name",
            ),
            (
                Entry {
                    xattrs: vec![Xattr {
                        name: b"user.big".to_vec(),
                        value: vec![0; XATTR_VALUE_MAX + 1],
                    }],
                    ..sample(b"f", Kind::Regular)
                },
                "attribute value over 64 KiB",
            ),
            (
                Entry {
                    xattrs: (0..20)
                        .map(|i| Xattr {
                            name: format!("user.{i}").into_bytes(),
                            value: vec![0; XATTR_VALUE_MAX],
                        })
                        .collect(),
                    ..sample(b"f", Kind::Regular)
                },
                "over 1 MiB of attributes",
            ),
        ];
        for (e, why) in cases {
            assert!(e.check().is_err(), "check passed: {why}");
            assert!(round_trip(&e).is_err(), "decoded: {why}");
        }
    }

    #[test]
    fn an_unknown_kind_is_refused() {
        let mut w = Writer::default();
        sample(b"f", Kind::Regular).encode(&mut w);
        let at = 4 + 1; // after the name's length and its one byte
        w.buf[at] = 9;
        let mut r = Reader::new(&w.buf);
        assert_eq!(
            Entry::decode(&mut r),
            Err(Error::Unknown {
                what: "entry kind",
                tag: 9
            })
        );
    }
}
