//! The planner: the minimum, the budget, the ranking, the time model, and the property that a
//! larger budget never plans a slower run.

use offload::{
    device_footprint, plan, LinkModel, Placement, Plan, PlanError, PlanRequest, PlanTag,
    ResidentNeeds, TensorKind, WeightTensor,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn tensor(name: &str, bytes: u64, kind: TensorKind) -> WeightTensor {
    WeightTensor {
        name: name.to_string(),
        bytes,
        layer: None,
        kind,
    }
}

fn needs() -> ResidentNeeds {
    ResidentNeeds {
        kv_cache: 3 * MIB,
        activations: MIB,
        workspace: 2 * MIB,
        graph: 8 * MIB,
        allocator_slack: 5 * MIB,
        offload_staging: 0,
    }
}

/// A small MoE-shaped model: per layer four dense matrices and a norm, three expert stacks
/// (8 experts, 2 used); an output projection and an untied embedding table.
fn moe_model(layers: u32) -> Vec<WeightTensor> {
    let mut t = Vec::new();
    for l in 0..layers {
        let mut add = |name: &str, bytes: u64, kind: TensorKind| {
            t.push(WeightTensor {
                name: format!("blk.{l}.{name}.weight"),
                bytes,
                layer: Some(l),
                kind,
            })
        };
        add("attn_norm", 4096, TensorKind::Dense);
        for m in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            add(m, 2 * MIB, TensorKind::Dense);
        }
        let experts = TensorKind::Experts {
            n_expert: 8,
            n_used: 2,
        };
        for m in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
            add(m, 16 * MIB, experts);
        }
    }
    t.push(tensor("output.weight", 12 * MIB, TensorKind::Shared));
    t.push(tensor("output_norm.weight", 4096, TensorKind::Shared));
    t.push(tensor(
        "token_embd.weight",
        12 * MIB,
        TensorKind::Lookup { rows: 32000 },
    ));
    t
}

fn plan_for(tensors: &[WeightTensor], budget: u64, link: LinkModel) -> Result<Plan, PlanError> {
    plan(&PlanRequest {
        tensors,
        needs: needs(),
        budget,
        link,
        other_device_reads_per_token: MIB,
        allow_streamed: true,
        lookups_on_host: false,
    })
}

fn footprints(tensors: &[WeightTensor], keep: impl Fn(&WeightTensor) -> bool) -> u64 {
    tensors
        .iter()
        .filter(|t| keep(t))
        .map(|t| device_footprint(t.bytes).unwrap())
        .sum()
}

fn is_whole(t: &WeightTensor) -> bool {
    matches!(t.kind, TensorKind::Dense | TensorKind::Shared)
}

fn placed(p: &Plan, placement: Placement, kind: fn(&WeightTensor) -> bool) -> usize {
    p.tensors
        .iter()
        .filter(|t| t.placement == placement && kind(&t.tensor))
        .count()
}

#[test]
fn a_budget_below_the_minimum_is_refused_with_the_minimum() {
    let tensors = moe_model(2);
    let minimum = needs().total().unwrap();
    let e = plan_for(&tensors, minimum - 1, LinkModel::h200_default()).unwrap_err();
    let PlanError::BelowMinimum {
        minimum: reported, ..
    } = &e
    else {
        panic!("{e}");
    };
    assert_eq!(*reported, minimum);
    let msg = e.to_string();
    assert!(msg.contains("minimum of 19.0 MiB"), "{msg}");
    assert!(msg.contains("at least 19.0MiB"), "{msg}");
    assert!(
        msg.contains("--gpu-budget") && msg.contains("kv_cache 3.0 MiB"),
        "{msg}"
    );

    // At the minimum itself every weight is read from the host, and nothing is staged.
    let p = plan_for(&tensors, minimum, LinkModel::h200_default()).unwrap();
    assert_eq!(p.total(), minimum);
    assert!(p
        .tensors
        .iter()
        .all(|t| t.placement == Placement::HostZeroCopy));
    assert_eq!(p.tag(PlanTag::OffloadStaging), 0);
}

#[test]
fn the_minimum_is_rounded_up_in_the_message() {
    let needs = ResidentNeeds {
        kv_cache: MIB + 1,
        ..ResidentNeeds::default()
    };
    let e = plan(&PlanRequest {
        tensors: &[],
        needs,
        budget: MIB,
        link: LinkModel::h200_default(),
        other_device_reads_per_token: 0,
        allow_streamed: true,
        lookups_on_host: false,
    })
    .unwrap_err()
    .to_string();
    // 1.000001 MiB: asking for "1.0MiB" would be refused again.
    assert!(e.contains("at least 1.1MiB"), "{e}");
}

#[test]
fn tags_sum_to_at_most_the_budget() {
    let tensors = moe_model(3);
    let all = needs().total().unwrap() + footprints(&tensors, |_| true);
    for budget in (0..=40).map(|i| needs().total().unwrap() + (all * i / 40)) {
        let p = plan_for(&tensors, budget, LinkModel::h200_default()).unwrap();
        assert!(p.total() <= budget, "{p}");
        assert_eq!(p.tags.iter().sum::<u64>(), p.total());
        let resident: u64 = p
            .tensors
            .iter()
            .filter(|t| t.placement == Placement::Device)
            .map(|t| t.tensor.bytes)
            .sum();
        assert_eq!(p.tag(PlanTag::Weights), resident);
        assert_eq!(p.tag(PlanTag::KvCache), needs().kv_cache);
    }
    // With room for everything, everything is resident and nothing crosses the link.
    let p = plan_for(&tensors, all, LinkModel::h200_default()).unwrap();
    assert!(p.tensors.iter().all(|t| t.placement == Placement::Device));
    assert_eq!(p.link_time_fs, 0);
}

#[test]
fn dense_and_shared_tensors_go_first_then_experts_then_lookups() {
    let tensors = moe_model(2);
    let minimum = needs().total().unwrap();
    let dense = footprints(&tensors, is_whole);
    let expert = device_footprint(16 * MIB).unwrap();
    let n_dense = tensors.iter().filter(|t| is_whole(t)).count();
    let is_expert = |t: &WeightTensor| matches!(t.kind, TensorKind::Experts { .. });
    for m in 0..=6 {
        let p = plan_for(
            &tensors,
            minimum + dense + m * expert,
            LinkModel::h200_default(),
        )
        .unwrap();
        assert_eq!(placed(&p, Placement::Device, is_whole), n_dense, "{m}: {p}");
        // A layer's three expert stacks are placed together (the hybrid split needs all
        // three on the host), so room for m stacks holds m / 3 whole layers.
        assert_eq!(
            placed(&p, Placement::Device, is_expert),
            m as usize / 3 * 3,
            "{m}: {}",
            p.tensor_listing()
        );
        for layer in 0..2u32 {
            let placements: Vec<Placement> = p
                .tensors
                .iter()
                .filter(|t| is_expert(&t.tensor) && t.tensor.layer == Some(layer))
                .map(|t| t.placement)
                .collect();
            assert!(
                placements.windows(2).all(|w| w[0] == w[1]),
                "{m}: layer {layer}'s expert stacks split: {placements:?}"
            );
        }
        let embd = p
            .tensors
            .iter()
            .find(|t| t.tensor.name == "token_embd.weight")
            .unwrap();
        // The lookup table ranks last: it takes the device only with the room whole layers
        // leave over.
        let leftover = (m % 3) * expert;
        assert_eq!(
            embd.placement == Placement::Device,
            leftover >= device_footprint(12 * MIB).unwrap(),
            "{m}"
        );
    }
    // The ranking itself: every dense or shared tensor ranks above every expert stack, and
    // the lookup table ranks last.
    let p = plan_for(&tensors, minimum, LinkModel::h200_default()).unwrap();
    let worst_dense = p
        .tensors
        .iter()
        .filter(|t| is_whole(&t.tensor))
        .map(|t| t.rank)
        .max()
        .unwrap();
    let best_expert = p
        .tensors
        .iter()
        .filter(|t| is_expert(&t.tensor))
        .map(|t| t.rank)
        .min()
        .unwrap();
    assert!(worst_dense < best_expert, "{}", p.tensor_listing());
    let embd = p
        .tensors
        .iter()
        .find(|t| t.tensor.name == "token_embd.weight")
        .unwrap();
    let last = p.tensors.iter().map(|t| t.rank).max().unwrap();
    assert_eq!(embd.rank, last, "{}", p.tensor_listing());
    assert!(
        p.tensors.iter().filter(|t| t.rank == last).count() == 1,
        "the lookup table ranks alone"
    );
}

#[test]
fn the_time_model_adds_bytes_over_rates() {
    let link = LinkModel::from_gbps(1000.0, 10.0, 1.0, "test");
    let tensors = [
        tensor("dense", 100 * MIB, TensorKind::Dense),
        tensor(
            "experts",
            80 * MIB,
            TensorKind::Experts {
                n_expert: 8,
                n_used: 1,
            },
        ),
    ];
    let minimum = needs().total().unwrap();
    // Copies are slower than reads in place here, so nothing streams.
    let p = plan_for(&tensors, minimum, link.clone()).unwrap();
    let expect_link = (100.0 + 10.0) * MIB as f64 / 10e9;
    let expect_device = MIB as f64 / 1000e9;
    let got = p.time_per_token_fs() as f64 / 1e15;
    assert!((got - expect_link - expect_device).abs() < 1e-12, "{got}");
    assert_eq!(p.tensors[1].read_per_token, 10 * MIB);
    // The dense tensor on the device: only the experts' eighth crosses the link.
    let p = plan_for(
        &tensors,
        minimum + device_footprint(100 * MIB).unwrap(),
        link,
    )
    .unwrap();
    assert_eq!(p.tensors[0].placement, Placement::Device);
    let got = p.link_time_fs as f64 / 1e15;
    assert!((got - 10.0 * MIB as f64 / 10e9).abs() < 1e-12, "{got}");
}

#[test]
fn streaming_is_chosen_when_copies_beat_reads_in_place_and_staging_fits() {
    // Copies four times as fast as reads in place: streaming a dense tensor saves three
    // quarters of its link time, if the budget holds two staging buffers of its size.
    let link = LinkModel::from_gbps(4000.0, 10.0, 40.0, "test");
    let tensors: Vec<WeightTensor> = (0..4)
        .map(|i| tensor(&format!("d{i}"), 8 * MIB, TensorKind::Dense))
        .collect();
    let minimum = needs().total().unwrap();
    let p = plan_for(&tensors, minimum + 16 * MIB, link.clone()).unwrap();
    assert_eq!(p.staging_slot, 8 * MIB, "{p}");
    assert_eq!(p.tag(PlanTag::OffloadStaging), 16 * MIB);
    assert_eq!(placed(&p, Placement::Streamed, |_| true), 4, "{p}");
    // The same 16 MiB could have held two tensors instead: streaming all four is faster.
    let resident_two = 2.0 * 8.0 * MIB as f64 / 10e9 + 2.0 * 8.0 * MIB as f64 / 4000e9;
    let got = p.time_per_token_fs() as f64 / 1e15;
    assert!(
        got < resident_two,
        "streaming should win: {got} vs {resident_two}"
    );
    assert!(p.total() <= minimum + 16 * MIB);
    // Below two staging buffers, nothing can stream.
    let p = plan_for(&tensors, minimum + 15 * MIB, link).unwrap();
    assert_eq!(p.staging_slot, 0);
    assert_eq!(placed(&p, Placement::Streamed, |_| true), 0);
    assert_eq!(placed(&p, Placement::Device, |_| true), 1);
}

#[test]
fn contradictory_input_is_an_error_not_a_panic() {
    let bad = [tensor(
        "blk.0.ffn_up_exps.weight",
        MIB,
        TensorKind::Experts {
            n_expert: 4,
            n_used: 5,
        },
    )];
    let e = plan_for(&bad, 1 << 30, LinkModel::h200_default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.0.ffn_up_exps.weight") && e.contains("more experts used"),
        "{e}"
    );
    let e = plan_for(
        &moe_model(1),
        1 << 30,
        LinkModel::from_gbps(0.0, 1.0, 1.0, "x"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("device read rate"), "{e}");
    let e = plan_for(
        &moe_model(1),
        1 << 30,
        LinkModel::from_gbps(1.0, f64::NAN, 1.0, "x"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("zero-copy"), "{e}");
    let huge = [
        tensor("a", u64::MAX, TensorKind::Dense),
        tensor("b", u64::MAX, TensorKind::Dense),
    ];
    assert!(matches!(
        plan_for(&huge, u64::MAX, LinkModel::h200_default()),
        Err(PlanError::Overflow { .. })
    ));
    let needs = ResidentNeeds {
        kv_cache: u64::MAX,
        workspace: 1,
        ..ResidentNeeds::default()
    };
    let e = plan(&PlanRequest {
        tensors: &[],
        needs,
        budget: u64::MAX,
        link: LinkModel::h200_default(),
        other_device_reads_per_token: 0,
        allow_streamed: true,
        lookups_on_host: false,
    });
    assert!(matches!(e, Err(PlanError::Overflow { .. })), "{e:?}");
}

fn kind_strategy() -> impl Strategy<Value = TensorKind> {
    prop_oneof![
        3 => Just(TensorKind::Dense),
        1 => Just(TensorKind::Shared),
        2 => (1u32..=128, 1u32..=128).prop_map(|(a, b)| TensorKind::Experts {
            n_expert: a.max(b),
            n_used: a.min(b),
        }),
        1 => (1u64..=300_000).prop_map(|rows| TensorKind::Lookup { rows }),
    ]
}

fn bytes_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => 1u64..=64 * 1024,
        2 => 64 * 1024..=12 * MIB,
        2 => 9 * MIB..=96 * MIB,
    ]
}

fn tensors_strategy() -> impl Strategy<Value = Vec<WeightTensor>> {
    prop::collection::vec((bytes_strategy(), kind_strategy()), 1..24).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (bytes, kind))| WeightTensor {
                name: format!("t{i}"),
                bytes,
                layer: Some(i as u32),
                kind,
            })
            .collect()
    })
}

fn needs_strategy() -> impl Strategy<Value = ResidentNeeds> {
    prop::array::uniform6(0u64..=64 * MIB).prop_map(|[a, b, c, d, e, f]| ResidentNeeds {
        kv_cache: a,
        activations: b,
        workspace: c,
        graph: d,
        allocator_slack: e,
        offload_staging: f / 8,
    })
}

fn link_strategy() -> impl Strategy<Value = LinkModel> {
    (100.0f64..6000.0, 1.0f64..120.0, 1.0f64..120.0)
        .prop_map(|(h, z, c)| LinkModel::from_gbps(h, z, c, "random"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// A larger budget never plans a slower run, and no plan takes more than its budget.
    #[test]
    fn a_larger_budget_never_plans_a_slower_run(
        tensors in tensors_strategy(),
        needs in needs_strategy(),
        link in link_strategy(),
        kv_reads in 0u64..=256 * MIB,
        subsets in prop::collection::vec(any::<u32>(), 8..32),
    ) {
        let minimum = needs.total().unwrap();
        let fits: Vec<u64> = tensors.iter().map(|t| device_footprint(t.bytes).unwrap()).collect();
        let everything: u64 = fits.iter().sum();
        let largest = tensors.iter().map(|t| t.bytes).max().unwrap_or(0);
        let span = everything + 2 * device_footprint(largest).unwrap();
        // Budgets where plans change: sums of random subsets of the tensors (with and without
        // two staging buffers of the largest), one byte either side, and an even sweep.
        let mut budgets: Vec<u64> = (0..=48).map(|i| minimum + span * i / 40).collect();
        for mask in subsets {
            let sum: u64 = fits
                .iter()
                .enumerate()
                .filter(|(i, _)| mask >> (i % 32) & 1 == 1)
                .map(|(_, f)| f)
                .sum();
            for base in [sum, sum + 2 * device_footprint(largest).unwrap()] {
                budgets.extend([minimum + base, minimum + base + 1, (minimum + base).saturating_sub(1)]);
            }
        }
        budgets.retain(|&b| b >= minimum);
        budgets.sort_unstable();
        budgets.dedup();
        let mut previous: Option<(u64, u128)> = None;
        for budget in budgets {
            let p = plan(&PlanRequest {
                tensors: &tensors,
                needs,
                budget,
                link: link.clone(),
                other_device_reads_per_token: kv_reads,
                allow_streamed: true,
                lookups_on_host: false,
            })
            .unwrap();
            prop_assert!(p.total() <= budget, "plan takes {} of {budget}:\n{p}", p.total());
            prop_assert_eq!(p.time_per_token_fs(), p.tensors.iter().map(|t| t.time_fs).sum::<u128>()
                + (kv_reads as f64 * 1e15 / link.device_read).round() as u128);
            if let Some((smaller, time)) = previous {
                prop_assert!(
                    p.time_per_token_fs() <= time,
                    "budget {budget} plans {} fs, slower than {time} fs at budget {smaller}:\n{p}\n{}",
                    p.time_per_token_fs(),
                    p.tensor_listing()
                );
            }
            previous = Some((budget, p.time_per_token_fs()));
        }
    }

    /// Budget one byte at a time around the points where tensors start to fit: the plan's
    /// time steps down and never up.
    #[test]
    fn monotone_at_every_byte_near_the_fit_points(
        tensors in tensors_strategy(),
        link in link_strategy(),
        at in 0usize..24,
    ) {
        let needs = ResidentNeeds { kv_cache: MIB, ..ResidentNeeds::default() };
        let minimum = needs.total().unwrap();
        let mut fits: Vec<u64> = tensors.iter().map(|t| device_footprint(t.bytes).unwrap()).collect();
        fits.sort_unstable();
        let prefix: u64 = fits.iter().take(at.min(fits.len())).sum();
        let centre = minimum + prefix;
        let mut last = u128::MAX;
        for budget in centre.saturating_sub(3).max(minimum)..=centre + 3 {
            let p = plan(&PlanRequest {
                tensors: &tensors,
                needs,
                budget,
                link: link.clone(),
                other_device_reads_per_token: 0,
                allow_streamed: true,
                lookups_on_host: false,
            })
            .unwrap();
            prop_assert!(p.total() <= budget);
            prop_assert!(p.time_per_token_fs() <= last);
            last = p.time_per_token_fs();
        }
    }
}

#[test]
fn without_streaming_no_weight_is_streamed_and_no_staging_is_reserved() {
    // The case where streaming wins (see the test above): copies four times as fast as reads
    // in place. A plan that may not stream reads the weights in place or keeps them resident.
    let link = LinkModel::from_gbps(4000.0, 10.0, 40.0, "test");
    let tensors: Vec<WeightTensor> = (0..4)
        .map(|i| tensor(&format!("d{i}"), 8 * MIB, TensorKind::Dense))
        .collect();
    let minimum = needs().total().unwrap();
    let streaming = plan_for(&tensors, minimum + 16 * MIB, link.clone()).unwrap();
    assert_eq!(
        placed(&streaming, Placement::Streamed, |_| true),
        4,
        "{streaming}"
    );
    for budget in [
        minimum,
        minimum + 16 * MIB,
        minimum + 20 * MIB,
        minimum + 40 * MIB,
    ] {
        let with = plan_for(&tensors, budget, link.clone()).unwrap();
        let p = plan(&PlanRequest {
            tensors: &tensors,
            needs: needs(),
            budget,
            link: link.clone(),
            other_device_reads_per_token: MIB,
            allow_streamed: false,
            lookups_on_host: false,
        })
        .unwrap();
        assert_eq!(placed(&p, Placement::Streamed, |_| true), 0, "{p}");
        assert_eq!(p.staging_slot, 0);
        assert_eq!(p.tag(PlanTag::OffloadStaging), 0);
        assert!(p.total() <= budget);
        // Never faster than the plan that may also stream.
        assert!(p.time_per_token_fs() >= with.time_per_token_fs());
    }
}

#[test]
fn host_staging_is_planned_only_while_a_weight_stays_on_the_host() {
    // 24 MiB of staging (the prefill's prefetch slots) against 8 MiB of weights: with every
    // weight on the device the staging is left out, so a budget below the "all on the host"
    // minimum can still hold the whole model.
    let tensors: Vec<WeightTensor> = (0..4)
        .map(|i| tensor(&format!("d{i}"), 2 * MIB, TensorKind::Dense))
        .collect();
    let staged = ResidentNeeds {
        offload_staging: 24 * MIB,
        ..needs()
    };
    let minimum = staged.total().unwrap();
    let everything = footprints(&tensors, |_| true);
    let all_on_device = minimum - 24 * MIB + everything;
    assert!(all_on_device < minimum);
    let request = |budget| PlanRequest {
        tensors: &tensors,
        needs: staged,
        budget,
        link: LinkModel::h200_default(),
        other_device_reads_per_token: MIB,
        allow_streamed: false,
        lookups_on_host: false,
    };
    let p = plan(&request(all_on_device)).unwrap();
    assert_eq!(placed(&p, Placement::Device, |_| true), 4, "{p}");
    assert_eq!(p.tag(PlanTag::OffloadStaging), 0, "{p}");
    assert!(p.total() <= all_on_device, "{p}");
    // One byte less: no longer all on the device, and below the minimum with the staging.
    let e = plan(&request(all_on_device - 1)).unwrap_err();
    assert!(matches!(e, PlanError::BelowMinimum { .. }), "{e}");
    // From all-on-device up, no staging.
    let p = plan(&request(minimum)).unwrap();
    assert_eq!(p.tag(PlanTag::OffloadStaging), 0, "{p}");
    let bigger = ResidentNeeds {
        offload_staging: MIB,
        ..needs()
    };
    let p = plan(&PlanRequest {
        needs: bigger,
        budget: bigger.total().unwrap() + 2 * MIB,
        ..request(0)
    })
    .unwrap();
    assert!(placed(&p, Placement::HostZeroCopy, |_| true) > 0, "{p}");
    assert_eq!(p.tag(PlanTag::OffloadStaging), MIB, "{p}");
    assert!(p.total() <= bigger.total().unwrap() + 2 * MIB, "{p}");
}

#[test]
fn streaming_shares_the_host_staging_and_small_tensors_stay_in_place() {
    // Copies four times as fast as reads in place, and the needs already hold two 8 MiB slots
    // (the prefill's): streaming 8 MiB tensors through them costs no more device memory, and
    // a 4 KiB vector, whose copy would take less than the per-copy overhead, is read in place.
    let link = LinkModel::from_gbps(4000.0, 10.0, 40.0, "test");
    let mut tensors: Vec<WeightTensor> = (0..4)
        .map(|i| tensor(&format!("d{i}"), 8 * MIB, TensorKind::Dense))
        .collect();
    tensors.push(tensor("norm", 4096, TensorKind::Dense));
    let staged = ResidentNeeds {
        offload_staging: 16 * MIB,
        ..needs()
    };
    let minimum = staged.total().unwrap();
    let p = plan(&PlanRequest {
        tensors: &tensors,
        needs: staged,
        budget: minimum,
        link,
        other_device_reads_per_token: MIB,
        allow_streamed: true,
        lookups_on_host: false,
    })
    .unwrap();
    assert_eq!(p.staging_slot, 8 * MIB, "{p}");
    assert_eq!(p.tag(PlanTag::OffloadStaging), 16 * MIB, "{p}");
    assert!(p.total() <= minimum, "{p}");
    let placement = |name: &str| {
        p.tensors
            .iter()
            .find(|t| t.tensor.name == name)
            .unwrap()
            .placement
    };
    assert_eq!(placement("d0"), Placement::Streamed, "{p}");
    assert_eq!(placement("norm"), Placement::HostZeroCopy, "{p}");
}

#[test]
fn lookup_tables_kept_on_the_host_leave_the_rest_planned_as_without_them() {
    let tensors = moe_model(2);
    let is_lookup = |t: &WeightTensor| matches!(t.kind, TensorKind::Lookup { .. });
    let rest: Vec<WeightTensor> = tensors.iter().filter(|t| !is_lookup(t)).cloned().collect();
    let staged = ResidentNeeds {
        offload_staging: 4 * MIB,
        ..needs()
    };
    let everything = footprints(&tensors, |_| true);
    for budget in [
        staged.total().unwrap(),
        staged.total().unwrap() + everything / 3,
        // Enough for every tensor, the table included.
        staged.total().unwrap() + everything,
    ] {
        let request = |tensors, lookups_on_host| PlanRequest {
            tensors,
            needs: staged,
            budget,
            link: LinkModel::h200_default(),
            other_device_reads_per_token: MIB,
            allow_streamed: false,
            lookups_on_host,
        };
        let with = plan(&request(&tensors, true)).unwrap();
        let without_table = plan(&request(&rest, false)).unwrap();
        assert_eq!(with.tensors.len(), tensors.len());
        for (planned, t) in with.tensors.iter().zip(&tensors) {
            assert_eq!(&planned.tensor, t, "input order");
            if is_lookup(t) {
                assert_eq!(planned.placement, Placement::HostZeroCopy, "{with}");
                assert!(planned.time_fs > 0, "its row is read over the link: {with}");
            } else {
                let alone = without_table
                    .tensors
                    .iter()
                    .find(|p| p.tensor.name == t.name)
                    .unwrap();
                assert_eq!(planned.placement, alone.placement, "{}: {with}", t.name);
            }
        }
        // The device holds what the plan of the other tensors holds, staging included (none
        // when those all fit), and the table's read joins the link's time.
        assert_eq!(with.tags, without_table.tags, "{with}");
        assert!(with.link_time_fs > without_table.link_time_fs, "{with}");
        assert_eq!(with.device_time_fs, without_table.device_time_fs);
        assert!(with.total() <= budget);
    }
    // Asked the default way, a budget that holds everything keeps the table on the device.
    let budget = staged.total().unwrap() + everything;
    let default = plan(&PlanRequest {
        tensors: &tensors,
        needs: staged,
        budget,
        link: LinkModel::h200_default(),
        other_device_reads_per_token: MIB,
        allow_streamed: false,
        lookups_on_host: false,
    })
    .unwrap();
    let table = default
        .tensors
        .iter()
        .find(|p| is_lookup(&p.tensor))
        .unwrap();
    assert_eq!(table.placement, Placement::Device, "{default}");
}
