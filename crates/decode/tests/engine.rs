//! The engine on its own thread: requests submitted from several threads stream the tokens
//! each gets when run alone, a cancelled request ends as cancelled and its blocks are free
//! after the engine's next step, a dropped handle cancels its request, and a bad request is
//! refused without stopping the engine.

mod common;

use common::{assert_finished, preset_file};
use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::context::{Context, ContextOptions};
use decode::engine::{Engine, Update};
use decode::gguf_loader::synth::Preset;
use decode::model::{Model, ModelSpec};
use decode::sampler::SamplerConfig;
use decode::scheduler::{Finish, Request};
use decode::session::Session;
use std::sync::Arc;

fn options(sequences: usize) -> ContextOptions {
    ContextOptions {
        context: 64,
        max_batch: 16,
        all_logits: false,
        sequences,
        kv_blocks: None,
    }
}

fn sampler(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 20,
        top_p: 0.95,
        seed,
        ..SamplerConfig::default()
    }
}

/// The tokens `r` gets run alone on a one-sequence session on the CPU's exact path.
fn alone(file: &Arc<decode::GgufFile>, r: &Request) -> Vec<u32> {
    let mut s = Session::load(file, CpuBackend::new(Precision::Exact), options(1)).unwrap();
    let g = decode::generate::generate(
        &mut s,
        &r.prompt,
        r.max_new,
        r.sampler,
        &|_| false,
        &mut |_| {},
    );
    g.unwrap().tokens
}

#[test]
fn requests_from_several_threads_stream_their_own_tokens_and_cancel() {
    let file = Arc::new(preset_file(Preset::TinyQwen3));
    let vocab = ModelSpec::from_gguf(&file).expect("spec").vocab as u32;
    let requests: Vec<Request> = (0..4u32)
        .map(|i| Request {
            prompt: (0..3 + 2 * i).map(|t| (t * 7 + i) % vocab).collect(),
            sampler: if i % 2 == 0 {
                SamplerConfig::default()
            } else {
                sampler(i as u64)
            },
            max_new: 6 + i as usize,
            stop: Vec::new(),
        })
        .collect();
    let alone: Vec<Vec<u32>> = requests.iter().map(|r| alone(&file, r)).collect();

    let mut be = CpuBackend::new(Precision::Exact);
    let model = Model::load(&file, &mut be).unwrap();
    let ctx = Context::new(&model, &mut be, options(3)).unwrap();
    let engine = Arc::new(Engine::start(model, be, ctx).unwrap());
    let threads: Vec<_> = requests
        .iter()
        .cloned()
        .map(|r| {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || engine.submit(r).unwrap().collect())
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let (tokens, end) = t.join().unwrap();
        assert_eq!(tokens, alone[i], "request {i}");
        assert!(
            matches!(end, Update::Finished { reason: Finish::TokenLimit, peak_kv_bytes } if peak_kv_bytes > 0),
            "request {i}: {end:?}"
        );
    }

    // Cancelled after its first token: it ends as cancelled, and once the engine has run a
    // step after it, its blocks are back.
    let long = Request {
        prompt: vec![1, 2, 3],
        sampler: SamplerConfig::default(),
        max_new: 60,
        stop: Vec::new(),
    };
    let mut handle = engine.submit(long.clone()).unwrap();
    assert_eq!(handle.next_update(), Some(Update::Started { cached: 0 }));
    assert!(matches!(handle.next_update(), Some(Update::Token(_))));
    let usage = engine.stats().unwrap();
    // Running, or just finished its step: while it runs its blocks are in the report.
    if let Some(u) = usage.sequences.iter().find(|u| u.id == handle.id()) {
        assert!(u.blocks >= 1 && u.positions >= 3, "{u:?}");
        assert_eq!(usage.pool.in_use, u.blocks);
    }
    handle.cancel();
    let (_, end) = handle.collect();
    assert_finished(&end, Finish::Cancelled);
    assert_eq!(
        engine.stats().unwrap().pool.in_use,
        0,
        "the cancelled request's blocks"
    );

    // A dropped handle cancels its request too.
    let dropped = engine.submit(long.clone()).unwrap();
    drop(dropped);
    let after = engine
        .submit(Request { max_new: 2, ..long })
        .unwrap()
        .collect();
    assert_finished(&after.1, Finish::TokenLimit);
    assert_eq!(
        engine.stats().unwrap().pool.in_use,
        0,
        "the dropped request's blocks"
    );

    // A bad request is refused; the engine goes on.
    let e = engine
        .submit(Request {
            prompt: Vec::new(),
            sampler: SamplerConfig::default(),
            max_new: 1,
            stop: Vec::new(),
        })
        .err()
        .expect("an empty prompt is refused")
        .to_string();
    assert!(e.contains("prompt"), "{e}");
    let ok = engine
        .submit(Request {
            prompt: vec![4],
            sampler: SamplerConfig::default(),
            max_new: 1,
            stop: Vec::new(),
        })
        .unwrap()
        .collect();
    assert_eq!(ok.0.len(), 1);
}

/// A server's pool that grows gives its memory back once the engine has been idle a while:
/// the prefix cache goes, no block stays backed and the KV books fall, while a stats query in
/// between does not count as work. The next request is served as before, the pool growing
/// again.
#[test]
fn an_idle_engine_drops_its_prefix_cache_and_gives_the_pool_memory_back() {
    use decode::MemoryTag;
    use std::time::Duration;
    let file = Arc::new(preset_file(Preset::TinyQwen3));
    let mut be = CpuBackend::new(Precision::Exact);
    let model = Model::load(&file, &mut be).unwrap();
    // Fewer blocks than the three sequences' whole contexts (3 x 4): a shared pool.
    let shared = ContextOptions {
        kv_blocks: Some(8),
        ..options(3)
    };
    let ctx = Context::new(&model, &mut be, shared).unwrap();
    let idle_release = Some(Duration::from_millis(400));
    let engine = Engine::start_with_idle_release(model, be, ctx, idle_release).unwrap();
    let request = Request {
        prompt: (1..=20).collect(),
        sampler: SamplerConfig::default(),
        max_new: 8,
        stop: Vec::new(),
    };
    let (first, _) = engine.submit(request.clone()).unwrap().collect();
    let busy = engine.stats().unwrap();
    assert!(busy.backed_blocks > 0 && busy.pool.cached > 0, "{busy:?}");
    let kv_busy = busy.memory.get(MemoryTag::KvCache);
    std::thread::sleep(Duration::from_millis(250));
    // Not yet: 250 ms idle, and this query does not restart the clock.
    assert_eq!(engine.stats().unwrap().backed_blocks, busy.backed_blocks);
    std::thread::sleep(Duration::from_millis(600));
    let idle = engine.stats().unwrap();
    assert_eq!((idle.backed_blocks, idle.pool.cached), (0, 0), "{idle:?}");
    assert!(idle.memory.get(MemoryTag::KvCache) < kv_busy, "{idle:?}");
    let (again, _) = engine.submit(request).unwrap().collect();
    assert_eq!(again, first, "served from memory backed anew");
    assert!(engine.stats().unwrap().backed_blocks > 0);
}

/// On a model with sliding-window rings (Gemma 3), a conversation's next turn goes on from the
/// prefix the last turn left: its window layers read the ring that turn's sequence filled,
/// taken over by another sequence slot while a third request runs in the first. Its tokens
/// are those of the whole prompt run alone.
#[test]
fn a_next_turn_on_window_rings_goes_on_from_the_ring_the_last_turn_left() {
    let file = Arc::new(preset_file(Preset::TinyGemma3));
    let spec = ModelSpec::from_gguf(&file).expect("spec");
    assert!(
        spec.layers.iter().any(|l| l.window.is_some()),
        "the preset has window layers"
    );
    let vocab = spec.vocab as u32;
    let greedy = |prompt: Vec<u32>, max_new| Request {
        prompt,
        sampler: SamplerConfig::default(),
        max_new,
        stop: Vec::new(),
    };
    let alone = |r: &Request| alone(&file, r);

    let mut be = CpuBackend::new(Precision::Exact);
    let model = Model::load(&file, &mut be).unwrap();
    let ctx = Context::new(&model, &mut be, options(3)).unwrap();
    assert!(
        !ctx.kv_plan().ring_slots.is_empty(),
        "a window of 8 in a context of 64 is a ring"
    );
    let engine = Engine::start(model, be, ctx).unwrap();

    let first = greedy((0..20).map(|t| (t * 5 + 3) % vocab).collect(), 8);
    let (answer, _) = engine.submit(first.clone()).unwrap().collect();
    assert_eq!(answer, alone(&first));
    assert_eq!(engine.stats().unwrap().ring_runs_cached, 1);

    // Another request takes the first slot (and a free ring), so the next turn runs in the
    // second slot, on the first turn's ring.
    let mut other = engine.submit(greedy(vec![1, 2, 3], 40)).unwrap();
    assert_eq!(other.next_update(), Some(Update::Started { cached: 0 }));
    assert!(matches!(other.next_update(), Some(Update::Token(_))));
    let mut prompt = first.prompt.clone();
    prompt.extend(&answer);
    prompt.extend([7, 8, 9, 10, 11].map(|t| t % vocab));
    // Sampled at temperature 1, so that every probability counts, not just the largest.
    let next = Request {
        sampler: SamplerConfig {
            temperature: 1.0,
            seed: 11,
            ..SamplerConfig::default()
        },
        ..greedy(prompt, 12)
    };
    let mut handle = engine.submit(next.clone()).unwrap();
    // The first turn wrote 27 positions: one whole block of 16 goes on from its ring.
    assert_eq!(handle.next_update(), Some(Update::Started { cached: 16 }));
    let (tokens, end) = handle.collect();
    assert_finished(&end, Finish::TokenLimit);
    assert_eq!(tokens, alone(&next), "the next turn's tokens");
    other.cancel();
    other.collect();

    // A prompt that leaves the first turn early finds no ring holding its window: it starts
    // from nothing, and still gets its own tokens.
    let early = greedy(first.prompt[..18].to_vec(), 4);
    let mut handle = engine.submit(early.clone()).unwrap();
    assert_eq!(handle.next_update(), Some(Update::Started { cached: 0 }));
    assert_eq!(handle.collect().0, alone(&early));
}
