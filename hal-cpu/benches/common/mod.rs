//! Helpers shared by the hal-cpu benches that are configured from the environment.

/// The environment variable `name` as a number, or `default` when unset or not one.
#[allow(dead_code)] // not every bench is configured from the environment
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `len` pseudo-random bytes with small values in every byte (`state` carries the
/// generator from call to call): any block type's scales and weights stay finite.
#[allow(dead_code)] // not every bench makes weights
pub fn small_bytes(len: usize, state: &mut u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (*state >> 33) as u8 & 0x3f
        })
        .collect()
}

/// A buffer of `u64` words (all 1) for [`read_loop`], from a 2 MiB boundary and advised
/// for transparent huge pages, as the CPU device's staged weights are
/// (`hal-cpu/src/arena.rs`): on small pages the read loop, the roofline the kernels are
/// measured against, would be the slower reader (the hardware prefetchers stop at each
/// 4 KiB page, and every page costs a TLB walk).
#[allow(dead_code)] // not every bench compares with a read
pub struct ReadBuf {
    map: memmap2::MmapMut,
    start: usize,
    words: usize,
}

#[allow(dead_code)] // not every bench compares with a read
impl ReadBuf {
    const HUGE_PAGE: usize = 2 << 20;

    /// `words` words.
    pub fn new(words: usize) -> Self {
        let bytes = words * 8;
        let map = memmap2::MmapMut::map_anon(bytes + Self::HUGE_PAGE).expect("read buffer mapping");
        let start = (Self::HUGE_PAGE - map.as_ptr() as usize % Self::HUGE_PAGE) % Self::HUGE_PAGE;
        #[cfg(unix)]
        let _ = map.advise_range(memmap2::Advice::HugePage, start, bytes);
        // Written once (the mapping is zeroed but not yet backed): every page faulted in
        // before the first timed read.
        let mut b = ReadBuf { map, start, words };
        b.words_mut().fill(1);
        b
    }

    fn words_mut(&mut self) -> &mut [u64] {
        bytemuck::cast_slice_mut(&mut self.map[self.start..self.start + self.words * 8])
    }

    /// The words.
    pub fn words(&self) -> &[u64] {
        bytemuck::cast_slice(&self.map[self.start..self.start + self.words * 8])
    }
}

/// A read of `buf` split over the pool's threads (sum of u64 words), each thread's slice
/// in four streams side by side with a software prefetch 1 KiB ahead of each: the access
/// pattern of the four-row decode kernels.
#[allow(dead_code)] // not every bench compares with a read
pub fn read_loop(pool: &rayon::ThreadPool, buf: &[u64]) -> u64 {
    split_read(pool, buf, sum_streams)
}

/// A read of `buf` split over the pool's threads, each thread's slice in one stream.
#[allow(dead_code)] // not every bench compares with a read
pub fn read_loop_plain(pool: &rayon::ThreadPool, buf: &[u64]) -> u64 {
    split_read(pool, buf, sum_plain)
}

/// The seconds the faster of [`read_loop`] and [`read_loop_plain`] takes over `buf` (the
/// roofline: whichever pattern reads faster on this host), the two run in the order
/// `plain_first` says.
#[allow(dead_code)] // not every bench compares with a read
pub fn fastest_read_secs(pool: &rayon::ThreadPool, buf: &[u64], plain_first: bool) -> f64 {
    let t = |f: fn(&rayon::ThreadPool, &[u64]) -> u64| {
        let t0 = std::time::Instant::now();
        std::hint::black_box(f(pool, buf));
        t0.elapsed().as_secs_f64()
    };
    let (a, b) = if plain_first {
        (t(read_loop_plain), t(read_loop))
    } else {
        (t(read_loop), t(read_loop_plain))
    };
    a.min(b)
}

fn split_read(pool: &rayon::ThreadPool, buf: &[u64], f: fn(&[u64]) -> u64) -> u64 {
    let per = buf.len().div_ceil(pool.current_num_threads());
    use rayon::prelude::*;
    pool.install(|| {
        buf.par_chunks(per)
            .map(f)
            .reduce(|| 0, |x, y| x.wrapping_add(y))
    })
}

fn sum_plain(c: &[u64]) -> u64 {
    let mut a = [0u64; 8];
    for w in c.chunks_exact(8) {
        for i in 0..8 {
            a[i] = a[i].wrapping_add(w[i]);
        }
    }
    let rest = c.chunks_exact(8).remainder().iter();
    a.iter().chain(rest).fold(0u64, |x, &y| x.wrapping_add(y))
}

fn sum_streams(c: &[u64]) -> u64 {
    const AHEAD: usize = 1024 / 8;
    let q = c.len() / 4 / 8 * 8;
    let s: [&[u64]; 4] = std::array::from_fn(|k| &c[k * q..(k + 1) * q]);
    let mut a = [[0u64; 8]; 4];
    for i in (0..q).step_by(8) {
        for k in 0..4 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults and reads nothing architecturally.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    s[k].as_ptr().wrapping_add(i + AHEAD).cast(),
                )
            };
            for j in 0..8 {
                a[k][j] = a[k][j].wrapping_add(s[k][i + j]);
            }
        }
    }
    a.iter()
        .flatten()
        .fold(sum_plain(&c[4 * q..]), |x, &y| x.wrapping_add(y))
}

/// A cpu device that keeps quantized weights as blocks, with `FLINT_THREADS` threads (all
/// cores when unset or not a number).
#[allow(dead_code)] // not every bench streams kept blocks
pub fn keep_quant_device() -> flint_hal_cpu::CpuDevice {
    flint_hal_cpu::CpuDevice::new(&flint_hal::DeviceOptions {
        threads: std::env::var("FLINT_THREADS")
            .ok()
            .and_then(|v| v.parse().ok()),
        keep_quant: true,
    })
    .expect("open cpu")
}
