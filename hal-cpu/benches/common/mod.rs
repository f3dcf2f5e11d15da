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

/// A plain read of `buf` split over the pool's threads (sum of u64 words).
#[allow(dead_code)] // not every bench compares with a read
pub fn read_loop(pool: &rayon::ThreadPool, buf: &[u64]) -> u64 {
    let per = buf.len().div_ceil(pool.current_num_threads());
    use rayon::prelude::*;
    pool.install(|| {
        buf.par_chunks(per)
            .map(|c| {
                let mut a = [0u64; 8];
                for w in c.chunks_exact(8) {
                    for i in 0..8 {
                        a[i] = a[i].wrapping_add(w[i]);
                    }
                }
                a.iter().fold(0u64, |x, &y| x.wrapping_add(y))
            })
            .reduce(|| 0, |x, y| x.wrapping_add(y))
    })
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
