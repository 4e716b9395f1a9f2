//! Graph-stable plans on the GPU: a CUDA graph captured once around `PagedPlan::run_on` replays
//! every later `PagedPlan::replan` (other lengths, other pages, one request holding every page,
//! empty requests), checked against the f64 reference each time; decode unsplit and with a KV
//! split (its merge launch in the graph), paged prefill, and ragged prefill (`PrefillPlan`).
//! Skipped without a CUDA device, unless `ATTNFORGE_REQUIRE_GPU=1` (then a missing device fails).

use attnforge::compare::{compare, Tolerance};
use attnforge::cuda::{
    capture_graph, DevicePagedKv, DeviceTensor, Engine, GraphCapacity, PagedGraphCapacity,
    PagedPlan, PlanOptions, PrefillPlan, SplitChoice,
};
use attnforge::dtype::DType;
use attnforge::paged::{KvOrder, KvStorage, PageTable, PagedAttention, PagedKv, PagedKvLayout};
use attnforge::problem::{AttentionProblem, HeadDims, Mask, RaggedBatch};
use attnforge::reference;
use attnforge::tensor::HostTensor;
use attnforge::testing::rng::SplitMix64;

const HQ: usize = 8;
const HKV: usize = 2;
const PAGE: usize = 16;
const PAGES: usize = 48;

/// The engine on device 0, or `None` (the test is skipped) on a machine without one; with
/// `ATTNFORGE_REQUIRE_GPU=1` a missing device fails the test instead.
fn engine() -> Option<Engine> {
    match Engine::new(0) {
        Ok(e) => Some(e),
        Err(e) if std::env::var("ATTNFORGE_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("ATTNFORGE_REQUIRE_GPU=1 and no CUDA device: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

fn layout(dims: usize) -> PagedKvLayout {
    PagedKvLayout {
        num_pages: PAGES,
        page_size: PAGE,
        num_kv_heads: HKV,
        head_dims: HeadDims::equal(dims).unwrap(),
        order: KvOrder::Nhd,
        storage: KvStorage::Separate,
        dtype: DType::F16,
    }
}

fn random(n: usize, rng: &mut SplitMix64) -> HostTensor {
    let v: Vec<f32> = (0..n).map(|_| rng.range_f64(-1.0, 1.0) as f32).collect();
    HostTensor::from_f32(DType::F16, &v)
}

/// A batch of `qo_lens[r]` queries over `kv_lens[r]` keys on pages drawn without repetition from
/// the cache, in a shuffled order.
fn batch(
    l: &PagedKvLayout,
    qo_lens: &[usize],
    kv_lens: &[usize],
    rng: &mut SplitMix64,
) -> PagedAttention {
    let mut ids: Vec<i32> = (0..l.num_pages as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.range_usize(0, i + 1));
    }
    let mut table = PageTable {
        kv_page_indptr: vec![0],
        kv_page_indices: Vec::new(),
        kv_last_page_len: Vec::new(),
    };
    for &kv in kv_lens {
        let pages = kv.div_ceil(PAGE);
        let start = table.kv_page_indices.len();
        table.kv_page_indices.extend(&ids[start..start + pages]);
        table
            .kv_page_indptr
            .push(table.kv_page_indices.len() as i32);
        let last = if kv == 0 { 0 } else { (kv - 1) % PAGE + 1 };
        table.kv_last_page_len.push(last as i32);
    }
    let mut qo_indptr = vec![0i32];
    for &q in qo_lens {
        qo_indptr.push(qo_indptr.last().unwrap() + q as i32);
    }
    let problem = PagedAttention::problem_for(qo_indptr, HQ, l, &table).unwrap();
    PagedAttention::new(problem, *l, table).unwrap()
}

/// Captures one run of the first batch, then for each batch (the first included) re-plans,
/// poisons the output, replays the graph and compares with the reference.
fn capture_then_replay(
    engine: &Engine,
    capacity: PagedGraphCapacity,
    options: PlanOptions,
    batches: &[(Vec<usize>, Vec<usize>)],
    expect_split: bool,
) {
    let mut rng = SplitMix64::new(7);
    let l = layout(128);
    let k = random(l.k_buffer_len(), &mut rng);
    let v = random(l.v_buffer_len(), &mut rng);
    let stream = engine.stream().clone();
    let (kd, vd) = (engine.upload(&k).unwrap(), engine.upload(&v).unwrap());
    let q_len = capacity.max_qo_tokens * HQ * 128;
    let q = random(q_len, &mut rng);
    let qd = engine.upload(&q).unwrap();
    let mut od = DeviceTensor::nan(&stream, DType::F16, q_len).unwrap();
    let mut lse = DeviceTensor::nan(&stream, DType::F32, capacity.max_qo_tokens * HQ).unwrap();
    let planned: Vec<PagedAttention> = batches
        .iter()
        .map(|(qo, kv)| batch(&l, qo, kv, &mut rng))
        .collect();
    let mut plan =
        PagedPlan::graph_stable(engine, &planned[0], None, options, capacity).expect("plan");
    assert_eq!(
        plan.kv_split().is_some(),
        expect_split,
        "{:?}",
        plan.kv_split()
    );
    let cache = DevicePagedKv::Separate { k: &kd, v: &vd };
    let graph = capture_graph(&stream, || {
        plan.run_on(&stream, &qd, cache, &mut od, Some(&mut lse))
    })
    .expect("capture");
    for (i, paged) in planned.iter().enumerate() {
        plan.replan(&stream, paged).expect("replan");
        od.fill_nan(&stream).unwrap();
        lse.fill_nan(&stream).unwrap();
        graph.launch().expect("replay");
        stream.synchronize().unwrap();
        let rows = paged.problem().batch.total_qo() * HQ;
        let o = od.download(&stream).unwrap();
        let o = HostTensor::from_f32(DType::F16, &o.to_f32_vec()[..rows * 128]);
        let l_all = lse.download(&stream).unwrap().to_f32_vec();
        let out = attnforge::AttentionOutput {
            o,
            lse: Some(l_all[..rows].to_vec()),
        };
        let q_used = HostTensor::from_f32(DType::F16, &q.to_f32_vec()[..rows * 128]);
        let want =
            reference::paged_attention(paged, &q_used, PagedKv::Separate { k: &k, v: &v }).unwrap();
        let cmp = compare(&out, &want);
        let tol = Tolerance::for_problem(paged.problem());
        assert!(
            cmp.passes(&tol),
            "batch {i} {:?}: {cmp:?}",
            paged.problem().batch.lens()
        );
    }
    drop(graph);
}

// Decode of 3 requests, unsplit: lengths and pages change at every plan; one plan gives a request
// every page of the capacity, one has an empty request.
#[test]
fn a_captured_decode_graph_replays_every_later_plan() {
    let Some(engine) = engine() else { return };
    let batches = vec![
        (vec![1; 3], vec![37, 100, 5]),
        (vec![1; 3], vec![1, 2, 3]),
        (vec![1; 3], vec![40 * PAGE - 3, 0, 1]),
        (vec![1; 3], vec![300, 17, 64]),
    ];
    let options = PlanOptions {
        split: SplitChoice::Unsplit,
        ..PlanOptions::default()
    };
    capture_then_replay(
        &engine,
        PagedGraphCapacity::decode(3, 42),
        options,
        &batches,
        false,
    );
}

// The same with a KV split of 64-key chunks: the merge launch is in the graph too.
#[test]
fn a_captured_split_decode_graph_replays_every_later_plan() {
    let Some(engine) = engine() else { return };
    let batches = vec![
        (vec![1; 3], vec![500, 3, 64]),
        (vec![1; 3], vec![40 * PAGE, 0, 1]),
        (vec![1; 3], vec![65, 129, 200]),
    ];
    let options = PlanOptions {
        split: SplitChoice::ChunkKeys(64),
        ..PlanOptions::default()
    };
    capture_then_replay(
        &engine,
        PagedGraphCapacity::decode(3, 42),
        options,
        &batches,
        true,
    );
}

// Paged prefill: query counts change too (up to the capacity), unsplit.
#[test]
fn a_captured_paged_prefill_graph_replays_every_later_plan() {
    let Some(engine) = engine() else { return };
    let capacity = PagedGraphCapacity {
        max_batch: 3,
        max_qo_tokens: 96,
        max_qo_len: 64,
        max_pages: 42,
    };
    let batches = vec![
        (vec![16, 30], vec![40, 100]),
        (vec![64, 1, 31], vec![64, 1, 300]),
        (vec![3], vec![10]),
    ];
    capture_then_replay(&engine, capacity, PlanOptions::default(), &batches, false);
}

// What does not fit the capacity, or changes what the graph holds by value, is refused.
#[test]
fn replans_beyond_the_capacity_are_refused() {
    let Some(engine) = engine() else { return };
    let mut rng = SplitMix64::new(3);
    let l = layout(128);
    let first = batch(&l, &[1; 2], &[20, 30], &mut rng);
    let mut plan = PagedPlan::graph_stable(
        &engine,
        &first,
        None,
        PlanOptions::default(),
        PagedGraphCapacity::decode(2, 4),
    )
    .unwrap();
    let stream = engine.stream().clone();
    let too_many_pages = batch(&l, &[1; 2], &[40, 40], &mut rng);
    let err = plan.replan(&stream, &too_many_pages).unwrap_err();
    assert!(err.to_string().contains("page ids"), "{err}");
    let too_many_requests = batch(&l, &[1; 3], &[1, 1, 1], &mut rng);
    assert!(plan.replan(&stream, &too_many_requests).is_err());
    let mut other_scale = batch(&l, &[1; 2], &[5, 5], &mut rng);
    let mut p = other_scale.problem().clone();
    p.sm_scale *= 0.5;
    other_scale = PagedAttention::new(p, l, other_scale.table().clone()).unwrap();
    assert!(plan.replan(&stream, &other_scale).is_err());
}

// Ragged prefill: queries and keys in capacity-sized buffers, the lengths change at every plan.
#[test]
fn a_captured_ragged_prefill_graph_replays_every_later_plan() {
    let Some(engine) = engine() else { return };
    let capacity = GraphCapacity {
        max_batch: 3,
        max_qo_tokens: 200,
        max_qo_len: 200,
        max_kv_tokens: 600,
    };
    let mut rng = SplitMix64::new(11);
    let stream = engine.stream().clone();
    let q = random(capacity.max_qo_tokens * HQ * 128, &mut rng);
    let k = random(capacity.max_kv_tokens * HKV * 128, &mut rng);
    let v = random(capacity.max_kv_tokens * HKV * 128, &mut rng);
    let (qd, kd, vd) = (
        engine.upload(&q).unwrap(),
        engine.upload(&k).unwrap(),
        engine.upload(&v).unwrap(),
    );
    let mut od = DeviceTensor::nan(&stream, DType::F16, q.len()).unwrap();
    let problem = |lens: &[(usize, usize)]| {
        AttentionProblem::new(
            RaggedBatch::from_lens(lens).unwrap(),
            HQ,
            HKV,
            HeadDims::equal(128).unwrap(),
            DType::F16,
        )
        .with_mask(Mask::Causal)
    };
    let batches = [
        vec![(100, 300), (50, 50), (50, 250)],
        vec![(1, 1), (199, 599)],
        vec![(7, 7), (0, 3), (3, 100)],
    ];
    let mut plan = PrefillPlan::graph_stable(
        &engine,
        &problem(&batches[0]),
        PlanOptions::default(),
        capacity,
    )
    .expect("plan");
    let graph = capture_graph(&stream, || {
        plan.run_on(&stream, &qd, &kd, &vd, &mut od, None)
    })
    .expect("capture");
    for lens in &batches {
        let p = problem(lens);
        plan.replan(&stream, &p).expect("replan");
        od.fill_nan(&stream).unwrap();
        graph.launch().expect("replay");
        stream.synchronize().unwrap();
        let (qo, kv) = (p.batch.total_qo(), p.batch.total_kv());
        let part = |t: &HostTensor, rows: usize, heads: usize| {
            HostTensor::from_f32(DType::F16, &t.to_f32_vec()[..rows * heads * 128])
        };
        let o = od.download(&stream).unwrap();
        let out = attnforge::AttentionOutput {
            o: part(&o, qo, HQ),
            lse: None,
        };
        let want = reference::attention(
            &p,
            &part(&q, qo, HQ),
            &part(&k, kv, HKV),
            &part(&v, kv, HKV),
        )
        .unwrap();
        let cmp = compare(&out, &want);
        assert!(cmp.passes(&Tolerance::for_problem(&p)), "{lens:?}: {cmp:?}");
    }
    drop(graph);
}
