//! Bounds: cost of one trivial syscall (getppid) vs one io_uring NOP and one io_uring
//! Close of a bad fd per SQE when submitted K at a time. The saving batching can buy per
//! replaced syscall is at most (syscall cost - per-SQE cost).
use io_uring::{IoUring, opcode, types};
use std::time::Instant;

fn main() {
    let n = 2_000_000u64;
    let t = Instant::now();
    for _ in 0..n {
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
    println!("getppid syscall: {:.1} ns/call", t.elapsed().as_nanos() as f64 / n as f64);
    let t = Instant::now();
    for _ in 0..n {
        unsafe { libc::close(-1) };
    }
    println!("close(-1) syscall: {:.1} ns/call", t.elapsed().as_nanos() as f64 / n as f64);
    for k in [1usize, 8, 32, 128] {
        let mut ring: IoUring = IoUring::builder().setup_single_issuer().setup_coop_taskrun().build(256).unwrap();
        let rounds = n as usize / k;
        let t = Instant::now();
        for _ in 0..rounds {
            for _ in 0..k {
                unsafe { ring.submission().push(&opcode::Nop::new().build()).unwrap() };
            }
            ring.submit_and_wait(k).unwrap();
            ring.completion().for_each(drop);
        }
        let nop = t.elapsed().as_nanos() as f64 / (rounds * k) as f64;
        let t = Instant::now();
        for _ in 0..rounds {
            for _ in 0..k {
                unsafe { ring.submission().push(&opcode::Close::new(types::Fd(-1)).build()).unwrap() };
            }
            ring.submit_and_wait(k).unwrap();
            ring.completion().for_each(drop);
        }
        let close = t.elapsed().as_nanos() as f64 / (rounds * k) as f64;
        println!("io_uring K={k:3}: NOP {nop:.1} ns/op, Close(-1) {close:.1} ns/op");
    }
}
