//! `invoke` on the expense pack's `find_expenses` through audit, scope and
//! cache: a hit, a miss, and the same page with no middleware at all.
//!
//! A miss alternates two argument sets that give the same 50-line page in a
//! cache of one entry, so every call runs the whole stack and the tool.

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use toolfleet_core::config::parse_tools;
use toolfleet_core::{CallCtx, MemoryAuditSink, Principal, Runtime, RuntimeConfig};
use toolfleet_expenses::{ExpenseBook, TOOLS_TOML, builtins, tools};

fn runtime(cache_capacity: usize) -> Runtime {
    let config = RuntimeConfig {
        cache_capacity,
        ..RuntimeConfig::default()
    };
    let mut runtime = Runtime::builder()
        .config(config)
        .audit_sink(Arc::new(MemoryAuditSink::new(1024)))
        .build();
    runtime
        .register_all(tools(Arc::new(ExpenseBook::default())).unwrap())
        .unwrap();
    runtime
}

/// `find_expenses` as declared but with no middleware, named `find_bare`.
fn bare_runtime() -> Runtime {
    let mut runtime = Runtime::builder().build();
    let mut find = parse_tools(TOOLS_TOML).unwrap().remove(0);
    find.name = "find_bare".into();
    find.middleware = Default::default();
    let executor = builtins(Arc::new(ExpenseBook::default()))["expenses.find"].clone();
    runtime
        .register(
            find.into_decl(&|_| Err(String::new()), Some(executor))
                .unwrap(),
        )
        .unwrap();
    runtime
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let ctx = CallCtx::new(Arc::new(Principal::new("acme", "alice", ["expenses:read"])));
    let page: [Value; 2] = [
        json!({"month": "2026-09"}),
        json!({"month": "2026-09", "cursor": "c0"}),
    ];

    let mut group = c.benchmark_group("invoke/find_expenses");
    let hit = runtime(10_000);
    group.bench_function("cache_hit", |b| {
        b.to_async(&rt)
            .iter(|| hit.invoke("find_expenses", page[0].clone(), &ctx))
    });
    let miss = runtime(1);
    let mut i = 0usize;
    group.bench_function("cache_miss", |b| {
        b.to_async(&rt).iter(|| {
            i += 1;
            miss.invoke("find_expenses", page[i % 2].clone(), &ctx)
        })
    });
    let bare = bare_runtime();
    group.bench_function("no_middleware", |b| {
        b.to_async(&rt)
            .iter(|| bare.invoke("find_bare", page[0].clone(), &ctx))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
