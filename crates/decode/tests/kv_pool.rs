//! The KV block pool under random use: sequences start (from the prefix cache where it has
//! their prompt's blocks), grow, fork, drop their window's old blocks, register their prompts
//! and finish, in any order, under a small budget. A simulated storage holds the token written
//! at each slot, so the test sees what a sequence would read back: its own tokens at every
//! position it still holds, through copy-on-write and through blocks found in the cache.
//! After every operation no block is leaked or owned beyond its count, and the pool stays
//! within its budget.

use decode::kv::{BlockPool, PoolError, SeqBlocks};
use proptest::prelude::*;

const BLOCK: usize = 4;
const BUDGET_BLOCKS: u64 = 12;

#[derive(Clone, Debug)]
enum Op {
    /// A new sequence with the given one of a few prompts (so prefixes repeat), of a length.
    Start {
        prompt: usize,
        len: usize,
    },
    Extend {
        seq: usize,
        n: usize,
        salt: u32,
    },
    Fork {
        seq: usize,
    },
    Finish {
        seq: usize,
    },
    Register {
        seq: usize,
    },
    Window {
        seq: usize,
        keep: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 1..14usize).prop_map(|(prompt, len)| Op::Start { prompt, len }),
        (0..8usize, 1..7usize, any::<u32>()).prop_map(|(seq, n, salt)| Op::Extend { seq, n, salt }),
        (0..8usize).prop_map(|seq| Op::Fork { seq }),
        (0..8usize).prop_map(|seq| Op::Finish { seq }),
        (0..8usize).prop_map(|seq| Op::Register { seq }),
        (0..8usize, 1..9usize).prop_map(|(seq, keep)| Op::Window { seq, keep }),
    ]
}

fn prompt(which: usize, len: usize) -> Vec<u32> {
    // Prompts 0 and 1 share their first two blocks; prompt 2 shares nothing.
    (0..len as u32)
        .map(|i| match which {
            0 => i,
            1 if i < 8 => i,
            1 => 100 + i,
            _ => 200 + i,
        })
        .collect()
}

struct Live {
    blocks: SeqBlocks,
    tokens: Vec<u32>,
    /// Positions before this one were given up (a window).
    from: usize,
}

/// Writes `live`'s tokens at positions `start..` into the storage, after the copies.
fn write(pool: &BlockPool, storage: &mut [Option<u32>], live: &Live, start: usize) {
    for pos in start..live.tokens.len() {
        let slot = pool
            .slot(&live.blocks, pos)
            .expect("a reserved position has a slot");
        storage[slot] = Some(live.tokens[pos]);
    }
}

fn check(pool: &BlockPool, storage: &[Option<u32>], live: &[Live]) {
    let stats = pool.stats();
    assert!(stats.committed <= stats.budget_blocks, "{stats:?}");
    assert_eq!(
        stats.in_use + stats.cached + stats.free,
        stats.committed,
        "{stats:?}"
    );
    let mut held = vec![0u32; stats.committed];
    for l in live {
        for id in l.blocks.blocks().iter().flatten() {
            held[id.0 as usize] += 1;
        }
    }
    assert_eq!(
        pool.reference_counts(),
        held,
        "a block's count is the tables naming it"
    );
    for (i, l) in live.iter().enumerate() {
        for pos in l.from..l.tokens.len() {
            let slot = pool
                .slot(&l.blocks, pos)
                .expect("a held position has a slot");
            assert_eq!(
                storage[slot],
                Some(l.tokens[pos]),
                "sequence {i} reads another's token at position {pos}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn the_pool_never_leaks_double_owns_or_passes_its_budget(ops in prop::collection::vec(op(), 1..60)) {
        let mut pool = BlockPool::new(BLOCK, 64, BUDGET_BLOCKS * 64, 3).unwrap();
        let mut storage = vec![None; BUDGET_BLOCKS as usize * BLOCK];
        let mut live: Vec<Live> = Vec::new();
        for op in ops {
            let before = pool.reference_counts();
            match op {
                Op::Start { prompt: which, len } => {
                    let tokens = prompt(which, len);
                    // At least one token is left to prefill, for its logits.
                    let mut blocks = pool.lookup(&tokens, tokens.len() - 1);
                    let found = blocks.len();
                    match pool.reserve(&mut blocks, tokens.len()) {
                        Ok(copies) => {
                            prop_assert!(copies.is_empty(), "found blocks are full");
                            let l = Live { blocks, tokens, from: 0 };
                            write(&pool, &mut storage, &l, found);
                            live.push(l);
                        }
                        Err(PoolError::Full { .. }) => pool.release(blocks),
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Extend { seq, n, salt } if seq < live.len() => {
                    let l = &mut live[seq];
                    let start = l.tokens.len();
                    match pool.reserve(&mut l.blocks, start + n) {
                        Ok(copies) => {
                            for c in copies {
                                for i in 0..BLOCK {
                                    storage[c.to.0 as usize * BLOCK + i] =
                                        storage[c.from.0 as usize * BLOCK + i];
                                }
                            }
                            l.tokens.extend((0..n as u32).map(|i| salt.wrapping_add(i) | 1 << 30));
                            write(&pool, &mut storage, &live[seq], start);
                        }
                        Err(PoolError::Full { .. }) => {
                            prop_assert_eq!(pool.reference_counts(), before, "a refused reserve changed the pool");
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Fork { seq } if seq < live.len() => {
                    let blocks = pool.fork(&live[seq].blocks);
                    let (tokens, from) = (live[seq].tokens.clone(), live[seq].from);
                    live.push(Live { blocks, tokens, from });
                }
                Op::Finish { seq } if seq < live.len() => {
                    let l = live.swap_remove(seq);
                    pool.release(l.blocks);
                }
                Op::Register { seq } if seq < live.len() => {
                    let l = &mut live[seq];
                    if l.from == 0 {
                        pool.register(&mut l.blocks, &l.tokens);
                    }
                }
                Op::Window { seq, keep } if seq < live.len() => {
                    let l = &mut live[seq];
                    let start = l.tokens.len().saturating_sub(keep);
                    pool.release_before(&mut l.blocks, start);
                    l.from = l.from.max(start / BLOCK * BLOCK);
                }
                _ => {}
            }
            check(&pool, &storage, &live);
        }
        for l in live.drain(..) {
            pool.release(l.blocks);
        }
        let stats = pool.stats();
        prop_assert_eq!(stats.in_use, 0, "blocks leaked: {:?}", stats);
    }
}
