//! Times `Device::matmul` on the Vulkan device for the matrix shapes of a small model's
//! prefill and decode (Gemma 3 270M): `cargo run --release -p flint-hal-vk --example
//! vk_matmul [filter]`. Prints milliseconds per call and GMAC/s.

use std::time::Instant;

use flint_core::GgmlType;
use flint_hal::{Device, WeightDesc, WeightKind, WeightSource};
use flint_hal_vk::VkDevice;

/// A small xorshift generator: deterministic values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `n` rows of `k` values in encoding `ty`: up to 512 distinct quantized rows, repeated.
fn weight_bytes(ty: GgmlType, k: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.row_bytes(k).expect("whole blocks");
    let distinct = n.min(512);
    let vals: Vec<f32> = (0..distinct * k).map(|_| rng.next()).collect();
    let mut rows = vec![0u8; distinct * row_bytes];
    flint_core::quant::quantize(ty, &vals, &mut rows).expect("quantize");
    let mut out = Vec::with_capacity(n * row_bytes);
    while out.len() < n * row_bytes {
        let take = (n * row_bytes - out.len()).min(rows.len());
        out.extend_from_slice(&rows[..take]);
    }
    out
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let dev = VkDevice::open(&Default::default()).expect("open the Vulkan device");
    println!("{}", dev.description());
    // k = 640 (the model width) is not whole 256-value blocks, so the K-quant cases are
    // the down projection (k = 2048); the output matrix (262144 x 640) is Q8_0.
    let cases: [(GgmlType, usize, usize, usize); 8] = [
        (GgmlType::Q4_K, 2048, 640, 1),
        (GgmlType::Q4_K, 2048, 640, 96),
        (GgmlType::Q6_K, 2048, 640, 96),
        (GgmlType::Q8_0, 640, 262_144, 1),
        (GgmlType::Q8_0, 640, 262_144, 96),
        (GgmlType::Q8_0, 640, 1024, 96),
        (GgmlType::Q5_0, 640, 1024, 96),
        (GgmlType::Q6_K, 2048, 262_144, 1),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    println!(
        "{:<6} {:>6} {:>8} {:>4} {:>10} {:>8}",
        "type", "k", "n", "m", "ms/call", "GMAC/s"
    );
    for (ty, k, n, m) in cases {
        let label = format!("{ty} {k}x{n} m={m}");
        if !label.contains(filter.as_str()) {
            continue;
        }
        let desc = WeightDesc {
            name: label.clone(),
            ty,
            dims: vec![k, n],
            kind: WeightKind::Matrix,
            data: WeightSource::from_vec(weight_bytes(ty, k, n, &mut rng)),
        };
        let w = dev.stage(&desc).expect("stage");
        drop(desc);
        let xs: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
        let x = dev.upload_new(&xs).expect("upload x");
        let mut out = dev.alloc(m * n).expect("alloc out");
        let mut probe = [0f32; 4];
        let mut run = |reps: usize| {
            let t = Instant::now();
            for _ in 0..reps {
                dev.matmul(&*w, x.view(), m, out.view_mut())
                    .expect("matmul");
            }
            dev.download(out.slice(0..4), &mut probe).expect("download");
            t.elapsed().as_secs_f64()
        };
        let first = run(1);
        // About a second of calls, at least one.
        let reps = ((1.0 / first) as usize).clamp(1, 50);
        let secs = run(reps) / reps as f64;
        let gmac = (k * n * m) as f64 / secs / 1e9;
        println!(
            "{:<6} {:>6} {:>8} {:>4} {:>10.2} {:>8.2}",
            ty.to_string(),
            k,
            n,
            m,
            secs * 1e3,
            gmac
        );
    }
}
