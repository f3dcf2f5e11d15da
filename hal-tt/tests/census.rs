//! The staging plan under a DRAM budget too small for the BF16 arm: expert towers stream
//! in the BF16 arm and stay resident in the keep-quant arm, and streamed weights still
//! compute correctly. One test, since it sets the simulator's DRAM through the
//! environment.

mod common;

use common::{
    bf16_round, expert_bytes, h, hm, matmul_core, matmul_ref, open_sim, rel_rms, weight, Rng,
};
use flint_core::GgmlType;
use flint_hal::{Device, HalErrorKind, KvLayout, Tier, WeightDesc, WeightKind};

const DRAM: u64 = 400_000;

fn model(rng: &mut Rng) -> Vec<(WeightDesc, Vec<f32>)> {
    let mut v = vec![
        weight(
            "token_embd.weight",
            GgmlType::Q8_0,
            &[256, 64],
            WeightKind::Embedding,
            rng,
        ),
        weight(
            "blk.0.attn_q.weight",
            GgmlType::Q4_K,
            &[256, 256],
            WeightKind::Matrix,
            rng,
        ),
    ];
    for p in ["gate", "up", "down"] {
        v.push(weight(
            &format!("blk.0.ffn_{p}_exps.weight"),
            GgmlType::Q4_K,
            &[256, 64, 8],
            WeightKind::ExpertTower,
            rng,
        ));
    }
    v
}

#[test]
fn census_streams_experts_only_in_the_bf16_arm() {
    std::env::set_var("FLINT_TT_SIM_DRAM_BYTES", DRAM.to_string());
    let mut rng = Rng::new(11);
    let model = model(&mut rng);
    let descs: Vec<WeightDesc> = model.iter().map(|(d, _)| d.clone()).collect();

    for keep in [false, true] {
        let dev = open_sim(keep);
        assert_eq!(dev.dram_bytes(), DRAM);
        let plan = dev.plan(&descs, 0).expect("plan");
        assert_eq!(plan.weights.len(), descs.len());
        for (pw, d) in plan.weights.iter().zip(&descs) {
            assert_eq!(pw.name, d.name);
            let tower = d.kind == WeightKind::ExpertTower;
            let want_tier = match (keep, tower) {
                (_, false) => Tier::Resident,
                (true, true) => Tier::ExpertResident,
                (false, true) => Tier::Streamed,
            };
            assert_eq!(pw.tier, want_tier, "keep {keep}: {}", d.name);
            let kept = keep && d.ty == GgmlType::Q4_K;
            assert_eq!(pw.kept_quant, kept, "{}", d.name);
        }
        let bf16_tower = 256 * 64 * 8 * 2;
        let q4k_tower = 256 * 64 * 8 / 256 * 144;
        if keep {
            assert_eq!(plan.streamed_bytes(), 0);
            assert_eq!(plan.expert_tier_bytes(), 3 * q4k_tower);
            // The Q8_0 embedding is not admitted: expanded without loss, to F32.
            assert_eq!(plan.resident_bytes(), 256 * 64 * 4 + 256 * 256 / 256 * 144);
        } else {
            assert_eq!(plan.streamed_bytes(), 3 * bf16_tower);
            assert_eq!(plan.expert_tier_bytes(), 0);
            assert_eq!(plan.resident_bytes(), 256 * 64 * 2 + 256 * 256 * 2);
        }

        // Stage under the plan and run the streamed (or resident) tower.
        let staged: Vec<_> = descs.iter().map(|d| dev.stage(d).expect("stage")).collect();
        for (s, pw) in staged.iter().zip(&plan.weights) {
            assert_eq!(s.info().tier, pw.tier, "{}", pw.name);
            assert_eq!(s.info().resident_bytes, pw.resident_bytes);
            assert_eq!(s.info().streamed_bytes, pw.streamed_bytes);
        }
        let used = dev.tt_counters().expect("counters").dram_used_bytes;
        assert_eq!(used, plan.resident_bytes() + plan.expert_tier_bytes());

        let (tower, deq) = (&staged[2], &model[2].1);
        let x = rng.vec(2 * 256);
        // One expert per input row: row 0 on expert 7, row 1 on expert 3.
        let ids = [7u32, 3];
        let mut out = vec![0.0; 2 * 64];
        dev.expert_matmul(&**tower, h(&x), (&ids).into(), hm(&mut out))
            .expect("expert matmul");
        let per = 256 * 64;
        let mut want = Vec::new();
        for (i, &e) in ids.iter().enumerate() {
            let e = e as usize;
            let xi = &x[i * 256..(i + 1) * 256];
            if keep {
                let b = expert_bytes(GgmlType::Q4_K, descs[2].data.as_slice(), 256, 64, e);
                want.extend(matmul_core(GgmlType::Q4_K, b, 256, xi));
            } else {
                want.extend(matmul_ref(
                    &bf16_round(&deq[e * per..(e + 1) * per]),
                    256,
                    xi,
                ));
            }
        }
        assert!(rel_rms(&out, &want) < 1e-6, "keep {keep}");
        let c = dev.tt_counters().expect("counters");
        if keep {
            assert_eq!(c.streamed_bytes, 0);
            assert_eq!(c.block_dispatches, 1);
        } else {
            // Two experts were used, each read from the host once.
            assert_eq!(c.streamed_bytes, 2 * 256 * 64 * 2);
            assert_eq!(c.float_dispatches, 1);
        }

        // The budget is real: a KV cache larger than the DRAM left is OutOfMemory.
        let big = KvLayout {
            num_blocks: 1024,
            block_size: 16,
            n_kv_heads: 2,
            head_dim_k: 64,
            head_dim_v: 64,
        };
        let e = dev.alloc_kv(&big).expect_err("does not fit");
        assert_eq!(e.kind, HalErrorKind::OutOfMemory, "{e}");
    }
    std::env::remove_var("FLINT_TT_SIM_DRAM_BYTES");
}
