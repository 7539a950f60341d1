//! The calls only raw block copies make: a device's size (`BLKGETSIZE64`), zeroing a range
//! by punching it (`fallocate`), direct I/O turned on for an open description, a loop
//! device's backing file (`LOOP_GET_STATUS64`), and buffers aligned for it.

use std::alloc::{self, Layout};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::cvt;

/// `ioctl(BLKGETSIZE64)`: a block device's size in bytes (what it holds, not what a claim
/// asked for).
pub fn device_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t); not exported by the libc crate everywhere.
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: the kernel writes one u64 into `size`.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut size) })?;
    Ok(size)
}

/// `fallocate(PUNCH_HOLE | KEEP_SIZE)` over `[off, off + len)`. On a block device the kernel
/// makes the range read back as zeros by discard or write-zeroes, never by writing zeros
/// itself (`BLKDEV_ZERO_NOFALLBACK`): where the device cannot, `EOPNOTSUPP`. On a file, a
/// hole.
pub fn punch_hole(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    cvt(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    })
    .map(drop)
}

/// The backing file of a loop device (`ioctl(LOOP_GET_STATUS64)`): its `(st_dev, st_ino)`,
/// encoded as `stat` encodes them. `None` for any other device (`ENOTTY`, `EINVAL`) and for
/// a loop device with no file bound (`ENXIO`).
pub fn loop_backing(fd: BorrowedFd<'_>) -> io::Result<Option<(u64, u64)>> {
    // LOOP_GET_STATUS64 and struct loop_info64 (linux/loop.h); not in the libc crate.
    const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
    #[repr(C)]
    struct LoopInfo64 {
        device: u64,
        inode: u64,
        rdevice: u64,
        offset: u64,
        sizelimit: u64,
        number: u32,
        encrypt_type: u32,
        encrypt_key_size: u32,
        flags: u32,
        file_name: [u8; 64],
        crypt_name: [u8; 64],
        encrypt_key: [u8; 32],
        init: [u64; 2],
    }
    // SAFETY: all-zero bytes are a valid LoopInfo64 (integers and byte arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one struct loop_info64 (232 bytes, this layout) into `info`.
    match cvt(unsafe { libc::ioctl(fd.as_raw_fd(), LOOP_GET_STATUS64, &mut info) }) {
        Ok(_) => Ok(Some((info.device, info.inode))),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTTY | libc::EINVAL | libc::ENXIO)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Turn `O_DIRECT` on (or off) for the open description behind `fd` (`fcntl(F_SETFL)`): its
/// reads and writes bypass the page cache from now on, for every descriptor sharing it.
/// `EINVAL` where the filesystem has no direct I/O.
pub fn set_direct(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) }).map(drop)
}

/// Zeroed bytes at an address aligned to [`AlignedBuf::ALIGN`], as direct I/O asks of a
/// buffer (a `Vec<u8>` is aligned to 1).
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation and hands out its bytes only through `&`/`&mut`
// borrows of itself, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above: a shared borrow only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub const ALIGN: usize = 4096;

    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout's size is not zero (at least ALIGN).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len.max(Self::ALIGN), Self::ALIGN).expect("buffer size")
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation) owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}
