//! GPU tests of the basic ops (norm, elementwise, sampling) that are not comparisons with the
//! reference, which live in the self-test table (`rocm_kernels::selftest`, run by
//! gpu_selftest.rs): refused shapes, the sampler's time on a real vocabulary, and the MoE
//! prefill's grouping of routed pairs, whose order within an expert is the device's. Each skips
//! with a printed reason without a GPU (fails under `HIPDECODE_REQUIRE_GPU=1`).

mod common;

use common::{download, setup, upload, view, view_mut};
use rocm_kernels::ops::elementwise::{self, GateActivation};
use rocm_kernels::ops::matmul_q8_mma::{self, group_tiles, PairGroups};
use rocm_kernels::ops::norm;
use rocm_kernels::ops::sampling::{self, SamplingParams, ARGMAX_WORKSPACE};
use rocm_kernels::reference;
use rocm_kernels::KernelError;
use test_support::rng::{seeded, uniform_vec};

#[test]
fn sampling_time_on_a_gemma_sized_vocabulary() {
    let Some((k, s)) = setup("sampling_time_on_a_gemma_sized_vocabulary") else {
        return;
    };
    let mut rng = seeded(8);
    let n = 262_144;
    let row = uniform_vec(&mut rng, n, -12.0, 18.0);
    let lb = upload(k, &row);
    let ws = upload(k, &vec![0u64; ARGMAX_WORKSPACE]);
    let out = upload(k, &[-1i32]);
    let drawb = upload(k, &[0.5f32]);
    for p in [
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.95,
        },
    ] {
        let run = || {
            sampling::sample(
                k,
                &s,
                view(&lb, n),
                n,
                &p,
                view(&drawb, 1),
                &mut view_mut(&ws, ARGMAX_WORKSPACE),
                &mut view_mut(&out, 1),
            )
            .unwrap()
        };
        run();
        s.synchronize().unwrap();
        let reps = 20;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            run();
        }
        s.synchronize().unwrap();
        // Informational (includes launch overhead); the lead records it.
        eprintln!(
            "sample {n} logits {p:?}: {:.1?} per call",
            t.elapsed() / reps
        );
        let got = download::<i32>(&s, &out, 1)[0];
        let want = reference::sampling::sample(&row, &p, 0.5).unwrap();
        assert!(
            want.margin < 1e-6 || got == want.token as i32,
            "{p:?}: gpu {got} cpu {want:?}"
        );
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let Some((k, s)) = setup("bad_shapes_are_errors_not_panics") else {
        return;
    };
    let b = upload(k, &[0.0f32; 16]);
    let ws = upload(k, &vec![0u64; ARGMAX_WORKSPACE]);
    let out = upload(k, &[0i32]);
    let is_shape = |r: rocm_kernels::Result<()>, what: &str| match r {
        Err(KernelError::Shape { .. }) => {}
        other => panic!("{what}: expected a shape error, got {other:?}"),
    };
    is_shape(
        norm::rms_norm(
            k,
            &s,
            view(&b, 16),
            view(&b, 4),
            &mut view_mut(&b, 16),
            5,
            4,
            1e-6,
        ),
        "norm rows past the end",
    );
    is_shape(
        norm::rms_norm_inplace(k, &s, &mut view_mut(&b, 16), view(&b, 4), 4, 0, 1e-6),
        "norm dim 0",
    );
    is_shape(
        norm::rms_norm_inplace(k, &s, &mut view_mut(&b, 16), view(&b, 4), 4, 4, f32::NAN),
        "norm eps NaN",
    );
    let (lo, hi) = (view_mut::<f32>(&b, 8), view::<f32>(&b, 16));
    let mut lo = lo;
    is_shape(
        elementwise::add(k, &s, &mut lo, hi.slice(4, 8).unwrap(), 8),
        "add over overlapping views",
    );
    is_shape(
        elementwise::gated(
            k,
            &s,
            &mut view_mut(&b, 16),
            view(&b, 4),
            8,
            GateActivation::Silu,
        ),
        "gated with short up",
    );
    is_shape(
        elementwise::add_scaled_row(k, &s, &mut view_mut(&b, 8), 2, view(&b, 4), view(&b, 1), 4),
        "add_scaled_row row past the end",
    );
    is_shape(
        elementwise::copy_rows(k, &s, view(&b, 8), 1, &mut view_mut(&b, 16), 3, 2, 4),
        "copy_rows source past the end",
    );
    is_shape(
        sampling::argmax(
            k,
            &s,
            view(&b, 16),
            17,
            &mut view_mut(&ws, 256),
            &mut view_mut(&out, 1),
        ),
        "argmax past the end",
    );
    is_shape(
        sampling::argmax(
            k,
            &s,
            view(&b, 16),
            16,
            &mut view_mut(&ws, 10),
            &mut view_mut(&out, 1),
        ),
        "argmax short workspace",
    );
    let outs = upload(k, &[0i32; 8]);
    is_shape(
        sampling::argmax_rows(k, &s, view(&b, 16), 4, 5, &mut view_mut(&outs, 8)),
        "argmax_rows past the end",
    );
    is_shape(
        sampling::argmax_rows(k, &s, view(&b, 16), 4, 4, &mut view_mut(&outs, 3)),
        "argmax_rows short out",
    );
    is_shape(
        sampling::argmax_rows(k, &s, view(&b, 16), usize::MAX, 2, &mut view_mut(&outs, 8)),
        "argmax_rows n past i32",
    );
    let bad = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 0.0,
    };
    is_shape(
        sampling::sample(
            k,
            &s,
            view(&b, 16),
            16,
            &bad,
            view(&b, 1),
            &mut view_mut(&ws, 256),
            &mut view_mut(&out, 1),
        ),
        "top_p 0",
    );
    s.synchronize().unwrap();
}

/// `matmul_q8_mma::group_pairs` against the host's grouping: the same tile table (then empty tiles),
/// each expert's slots holding exactly its pairs' tokens, padding slots token 0, each pair
/// sent back from a slot holding its token, and ids outside the experts sent nowhere (-1).
#[test]
fn moe_pairs_are_grouped_on_the_device_as_the_host_groups_them() {
    let Some((kn, s)) = setup("moe_pairs_are_grouped_on_the_device_as_the_host_groups_them") else {
        return;
    };
    let mut rng = seeded(23);
    // A prefill chunk of 61 tokens routed to 8 of 128 experts (some experts get more than a
    // tile of 64 rows, most a few, some none), with two ids no expert has.
    let (n_tokens, k, n_expert, align) = (61usize, 8usize, 128usize, 4usize);
    let pairs = n_tokens * k;
    let mut ids: Vec<i32> = (0..pairs)
        .map(|p| {
            let r = (uniform_vec(&mut rng, 1, 0.0, 1.0)[0] * 1000.0) as usize;
            // Skewed: half of the pairs go to experts 0 and 1 (about 120 each, so both take
            // two tiles of 64 slots).
            if r.is_multiple_of(2) {
                (p % 2) as i32
            } else {
                (r % n_expert) as i32
            }
        })
        .collect();
    ids[5] = -1;
    ids[77] = n_expert as i32;
    let slots = pairs + n_expert * (align - 1);
    let shape = PairGroups {
        pairs,
        k,
        n_expert,
        align,
        slots,
    };
    let entries = shape.tile_entries();
    let ids_d = upload(kn, &ids);
    let (slot_d, pair_d) = (
        upload(kn, &vec![7i32; slots]),
        upload(kn, &vec![7i32; pairs]),
    );
    let tiles_d = upload(kn, &vec![7i32; entries]);
    matmul_q8_mma::group_pairs(
        kn,
        &s,
        view(&ids_d, pairs),
        shape,
        &mut view_mut(&slot_d, slots),
        &mut view_mut(&pair_d, pairs),
        &mut view_mut(&tiles_d, entries),
    )
    .expect("group_pairs");
    let slot_token: Vec<i32> = download(&s, &slot_d, slots);
    let pair_slot: Vec<i32> = download(&s, &pair_d, pairs);
    let tiles: Vec<i32> = download(&s, &tiles_d, entries);

    let mut counts = vec![0usize; n_expert];
    for &e in &ids {
        if (0..n_expert as i32).contains(&e) {
            counts[e as usize] += 1;
        }
    }
    let mut starts = Vec::new();
    let mut end = 0;
    for &c in &counts {
        starts.push(end);
        end = (end + c).next_multiple_of(align);
    }
    let mut want_tiles = group_tiles(&starts, &counts).expect("tiles");
    assert!(
        counts.iter().any(|&c| c > 64),
        "a test routing with a two-tile expert"
    );
    want_tiles.resize(entries, 0);
    assert_eq!(tiles, want_tiles, "the tile table");
    let mut used = vec![false; slots];
    for (p, &e) in ids.iter().enumerate() {
        let slot = pair_slot[p];
        if !(0..n_expert as i32).contains(&e) {
            assert_eq!(slot, -1, "pair {p} of id {e}");
            continue;
        }
        let (start, count) = (starts[e as usize], counts[e as usize]);
        let slot = usize::try_from(slot).expect("a slot");
        assert!(
            (start..start + count).contains(&slot),
            "pair {p} of expert {e} in slot {slot}, outside {start}..{}",
            start + count
        );
        assert!(!used[slot], "slot {slot} taken twice");
        used[slot] = true;
        assert_eq!(slot_token[slot], (p / k) as i32, "slot {slot}'s token");
    }
    for (slot, taken) in used.iter().enumerate() {
        if !taken {
            assert_eq!(slot_token[slot], 0, "padding slot {slot}");
        }
    }
}
