// Paged K/V caches: which cache row holds a sequence's slot.
//
// A paged cache is a pool of blocks of 2^shift rows. Each sequence has a table of block ids (a
// row of `tables`, table_len entries), and token t of a launch belongs to the sequence seqs[t].
// Slot s of that sequence (position p is slot p % slots, a ring for sliding-window layers) is
// row table[s >> shift] * 2^shift + (s & (2^shift - 1)). Without tables (null) the cache holds
// one sequence's slots in order: row = slot.
//
// Every kernel that reads or writes a cache takes the same six parameters, KV_PAGES_PARAMS,
// and finds a token's table with kv_pages(KV_PAGES_ARGS, t). The host checks the tables and
// sequence ids it writes; the clamps below only keep a bad one inside the memory it was given.
#pragma once

#define KV_PAGES_PARAMS                                                                  \
    const i32 *kv_seqs, const i32 *kv_tables, u32 kv_table_len, u32 kv_n_tables, u32 kv_shift, \
        u32 kv_rows
#define KV_PAGES_ARGS kv_seqs, kv_tables, kv_table_len, kv_n_tables, kv_shift, kv_rows

struct KvPages {
    // This token's table, or null for an unpaged cache.
    const i32* table;
    u32 shift;
    // Rows of the cache.
    u32 rows;
};

DEVICE KvPages kv_pages(const i32* seqs, const i32* tables, u32 table_len, u32 n_tables,
                        u32 shift, u32 rows, u32 t) {
    KvPages p;
    p.shift = shift;
    p.rows = rows;
    p.table = 0;
    if (tables != 0) {
        u32 s = (u32)seqs[t];
        if (s >= n_tables) s = 0;
        p.table = tables + (u64)s * table_len;
    }
    return p;
}

// Whether token t is a padding row of a step run as a larger captured graph (sequence id
// KV_PADDING_ROW). Its keys and values must not be stored: the id clamps to sequence 0's table,
// which a store would overwrite. Reads through that table stay in bounds and go unused.
#define KV_PADDING_ROW (-1)
DEVICE bool kv_padding_row(const i32* seqs, const i32* tables, u32 t) {
    return tables != 0 && seqs[t] == KV_PADDING_ROW;
}

// The cache row of `slot` (slot < table_len << shift, which the host checks).
DEVICE u64 kv_row(const KvPages& p, u32 slot) {
    if (p.table == 0) return slot;
    const u32 mask = (1u << p.shift) - 1u;
    const u64 r = ((u64)(u32)p.table[slot >> p.shift] << p.shift) | (u64)(slot & mask);
    return r < p.rows ? r : (u64)p.rows - 1u;
}
