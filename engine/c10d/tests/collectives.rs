//! Gloo groups of 2 and 4 ranks as threads of this process, each rank with its own store client
//! (as worker processes have) over one store server, on loopback.

use miles_c10d::{Error, GlooDevice, ProcessGroup, ReduceOp, Store};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

const TIMEOUT: Duration = Duration::from_secs(30);

fn server() -> Store {
    Store::server("127.0.0.1", 0, TIMEOUT).expect("store server")
}

fn join(port: u16, prefix: &str, rank: usize, world: usize, timeout: Duration) -> Result<ProcessGroup, Error> {
    let store = Store::client("127.0.0.1", port, timeout)?;
    ProcessGroup::gloo_on(&store, prefix, rank, world, timeout, &GlooDevice::Hostname("127.0.0.1".into()))
}

/// Runs `body` as every rank of a fresh group of `world` threads and returns the ranks' results
/// in rank order.
fn world_of<R: Send + 'static>(world: usize, body: impl Fn(&ProcessGroup) -> R + Send + Sync + 'static) -> Vec<R> {
    let store = server();
    let port = store.port();
    let body = Arc::new(body);
    // No rank closes its connections while another still finishes a collective over them (ranks
    // that are processes end with the run; threads of one process end one by one).
    let done = Arc::new(Barrier::new(world));
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let (body, done) = (body.clone(), done.clone());
            std::thread::spawn(move || {
                let pg = join(port, "test", rank, world, TIMEOUT).expect("join");
                assert_eq!((pg.rank(), pg.world()), (rank, world));
                let out = body(&pg);
                done.wait();
                out
            })
        })
        .collect();
    let out = threads.into_iter().map(|t| t.join().expect("rank thread")).collect();
    drop(store);
    out
}

/// Runs a test that leaves a group broken (a peer gone, silent or never there) in a process of its
/// own: libtorch's Gloo threads of a failed group may outlive it, and other tests' groups in the
/// same process must not share the process with them.
fn isolated(name: &str, body: impl FnOnce()) {
    if std::env::var_os("MILES_C10D_ISOLATED").is_some() {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = std::process::Command::new(exe)
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env("MILES_C10D_ISOLATED", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the test in its own process");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} did not finish within 60 s in its own process");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{name} in its own process: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
}

#[test]
fn store_set_get_between_clients_and_a_missing_key_times_out() {
    let store = server();
    let a = Store::client("127.0.0.1", store.port(), TIMEOUT).unwrap();
    let b = Store::client("127.0.0.1", store.port(), Duration::from_millis(500)).unwrap();
    a.set("k", b"value\0with nul").unwrap();
    assert_eq!(b.get("k").unwrap(), b"value\0with nul");
    a.set("empty", b"").unwrap();
    assert_eq!(b.get("empty").unwrap(), Vec::<u8>::new());
    let start = Instant::now();
    let err = b.get("never-set").unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3), "get waited {:?}", start.elapsed());
    assert!(err.0.contains("never-set") && err.0.contains(&store.port().to_string()), "{err}");
}

#[test]
fn a_server_bound_to_every_address_answers_by_name_and_by_loopback() {
    // The controller binds its store on the launcher's address, 0.0.0.0 for a multi-host run.
    let store = Store::server("0.0.0.0", 0, TIMEOUT).unwrap();
    store.set("from-server", b"1").unwrap();
    for host in ["127.0.0.1", "localhost"] {
        let client = Store::client(host, store.port(), TIMEOUT).unwrap();
        assert_eq!(client.get("from-server").unwrap(), b"1", "via {host}");
    }
}

#[test]
fn a_client_with_no_server_fails_within_its_timeout() {
    // A port that was free a moment ago: bind, read, release.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let start = Instant::now();
    let err = Store::client("127.0.0.1", port, Duration::from_secs(1)).err().expect("no server");
    assert!(start.elapsed() < Duration::from_secs(5), "connect waited {:?}", start.elapsed());
    assert!(err.0.contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[test]
fn all_reduce_sum_max_min_over_2_and_4_ranks() {
    for world in [2usize, 4] {
        let out = world_of(world, |pg| {
            let r = pg.rank() as f32;
            // Rank r holds [r, -r, r*r] (+ 0.5 so that sum and max differ in every slot).
            let base = [r + 0.5, -r, r * r];
            let mut sum = Tensor::from_slice(&base);
            pg.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
            let mut max = Tensor::from_slice(&base);
            pg.all_reduce(&mut max, ReduceOp::Max).unwrap();
            let mut min = Tensor::from_slice(&base);
            pg.all_reduce(&mut min, ReduceOp::Min).unwrap();
            (values(&sum), values(&max), values(&min))
        });
        let n = world as f32;
        let ranks: Vec<f32> = (0..world).map(|r| r as f32).collect();
        let want_sum = vec![
            ranks.iter().map(|r| r + 0.5).sum::<f32>(),
            -ranks.iter().sum::<f32>(),
            ranks.iter().map(|r| r * r).sum::<f32>(),
        ];
        let want_max = vec![n - 1.0 + 0.5, 0.0, (n - 1.0) * (n - 1.0)];
        let want_min = vec![0.5, -(n - 1.0), 0.0];
        for (sum, max, min) in out {
            assert_eq!(sum, want_sum, "world {world}");
            assert_eq!(max, want_max, "world {world}");
            assert_eq!(min, want_min, "world {world}");
        }
    }
}

#[test]
fn all_reduce_many_reduces_every_bucket() {
    let out = world_of(4, |pg| {
        let r = pg.rank() as f64;
        // Buckets of different sizes and dtypes, all in flight at once.
        let mut ts = vec![
            Tensor::full([1000], r, (Kind::Float, tch::Device::Cpu)),
            Tensor::full([3, 7], 2.0 * r, (Kind::Double, tch::Device::Cpu)),
            Tensor::full([1], r, (Kind::Int64, tch::Device::Cpu)),
            Tensor::full([250_000], 1.0, (Kind::Float, tch::Device::Cpu)),
        ];
        pg.all_reduce_many(&mut ts, ReduceOp::Sum).unwrap();
        ts.iter().map(|t| (t.min().double_value(&[]), t.max().double_value(&[]))).collect::<Vec<_>>()
    });
    for buckets in out {
        assert_eq!(buckets, vec![(6.0, 6.0), (12.0, 12.0), (6.0, 6.0), (4.0, 4.0)]);
    }
}

#[test]
fn broadcast_all_gather_reduce_scatter_and_barrier() {
    for world in [2usize, 4] {
        let out = world_of(world, move |pg| {
            let r = pg.rank() as f32;
            let root = world - 1;
            let mut b = Tensor::from_slice(&[r, r + 1.0]);
            pg.broadcast(&mut b, root).unwrap();

            let input = Tensor::from_slice(&[r, 10.0 * r]);
            let mut gathered: Vec<Tensor> =
                (0..world).map(|_| Tensor::zeros([2], (Kind::Float, tch::Device::Cpu))).collect();
            pg.all_gather(&mut gathered, &input).unwrap();

            // Rank r contributes [r + k, k] to rank k's slot.
            let inputs: Vec<Tensor> = (0..world).map(|k| Tensor::from_slice(&[r + k as f32, k as f32])).collect();
            let mut scattered = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
            pg.reduce_scatter(&mut scattered, &inputs).unwrap();

            pg.barrier().unwrap();
            (values(&b), gathered.iter().map(values).collect::<Vec<_>>(), values(&scattered))
        });
        let n = world as f32;
        let rank_sum: f32 = (0..world).map(|r| r as f32).sum();
        for (rank, (b, gathered, scattered)) in out.into_iter().enumerate() {
            assert_eq!(b, vec![n - 1.0, n], "world {world} rank {rank}");
            let want: Vec<Vec<f32>> = (0..world).map(|q| vec![q as f32, 10.0 * q as f32]).collect();
            assert_eq!(gathered, want, "world {world} rank {rank}");
            let k = rank as f32;
            assert_eq!(scattered, vec![rank_sum + n * k, n * k], "world {world} rank {rank}");
        }
    }
}

#[test]
fn the_same_all_reduce_twice_is_bit_identical_on_every_rank() {
    let out = world_of(4, |pg| {
        // Values whose float sum depends on the order of addition: a fixed pseudo-random spread
        // over many magnitudes, different on every rank.
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (pg.rank() as u64 + 1);
        let data: Vec<f32> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let mant = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                mant * 10f32.powi((x % 9) as i32 - 4)
            })
            .collect();
        let mut first = Tensor::from_slice(&data);
        let mut second = first.copy();
        pg.all_reduce(&mut first, ReduceOp::Sum).unwrap();
        pg.all_reduce(&mut second, ReduceOp::Sum).unwrap();
        (Vec::<f32>::try_from(first).unwrap(), Vec::<f32>::try_from(second).unwrap())
    });
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let reference = bits(&out[0].0);
    for (rank, (first, second)) in out.iter().enumerate() {
        assert_eq!(bits(first), bits(second), "rank {rank}: repeat differs");
        assert_eq!(bits(first), reference, "rank {rank} differs from rank 0");
    }
}

#[test]
fn ranks_that_never_join_are_named_within_the_timeout() {
    isolated("ranks_that_never_join_are_named_within_the_timeout", || {
        let store = server();
        let port = store.port();
        let timeout = Duration::from_secs(2);
        let start = Instant::now();
        let e = join(port, "lonely", 0, 2, timeout).err().expect("rank 1 never joins");
        let waited = start.elapsed();
        assert!(waited >= timeout && waited < timeout + Duration::from_secs(2), "waited {waited:?}");
        assert!(e.0.starts_with("rank 1 of 2 never joined the c10d group `lonely`"), "{e}");
        assert!(e.0.contains("within 2 s"), "{e}");

        // Of four, ranks 0 and 2 come; 1 and 3 never do.
        let threads: Vec<_> = [0usize, 2]
            .into_iter()
            .map(|rank| {
                std::thread::spawn(move || join(port, "half", rank, 4, timeout).err().expect("incomplete group"))
            })
            .collect();
        for t in threads {
            let e = t.join().unwrap();
            assert!(e.0.starts_with("ranks 1, 3 of 4 never joined the c10d group `half`"), "{e}");
        }
    });
}

#[test]
fn a_peer_that_drops_its_group_fails_the_others_collective_without_a_hang() {
    isolated("a_peer_that_drops_its_group_fails_the_others_collective_without_a_hang", || {
        let store = server();
        let port = store.port();
        let timeout = Duration::from_secs(3);
        let after_first = Arc::new(Barrier::new(2));
        let peer = {
            let after_first = after_first.clone();
            std::thread::spawn(move || {
                let pg = join(port, "drop", 1, 2, timeout).unwrap();
                let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
                pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
                drop(pg); // gone mid-way: closes its connections
                after_first.wait();
            })
        };
        let pg = join(port, "drop", 0, 2, timeout).unwrap();
        let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
        pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
        assert_eq!(values(&t), vec![2.0; 4]);
        after_first.wait();
        let start = Instant::now();
        let e = pg.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
        assert!(start.elapsed() < timeout + Duration::from_secs(1), "waited {:?}", start.elapsed());
        assert!(e.0.starts_with("rank 0 of 2: all_reduce: "), "{e}");
        // The group is out of step now: later calls fail at once, naming the first failure.
        let start = Instant::now();
        let again = pg.barrier().unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(100));
        assert!(again.0.contains("failed earlier") && again.0.contains("cannot be used again"), "{again}");
        peer.join().unwrap();
    });
}

#[test]
fn a_silent_peer_times_the_collective_out() {
    isolated("a_silent_peer_times_the_collective_out", || {
        // The peer stays connected but never calls the collective (a stopped or stuck process).
        let store = server();
        let port = store.port();
        let timeout = Duration::from_secs(2);
        let done = Arc::new(Barrier::new(2));
        let peer = {
            let done = done.clone();
            std::thread::spawn(move || {
                let pg = join(port, "silent", 1, 2, timeout).unwrap();
                done.wait();
                drop(pg);
            })
        };
        let pg = join(port, "silent", 0, 2, timeout).unwrap();
        let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
        let start = Instant::now();
        let e = pg.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(1900) && waited < timeout + Duration::from_secs(2),
            "waited {waited:?}"
        );
        assert!(e.0.starts_with("rank 0 of 2: all_reduce: no answer within 2 s: a rank did not take part"), "{e}");
        done.wait();
        peer.join().unwrap();
    });
}

#[test]
fn bad_tensors_and_arguments_are_refused_and_leave_the_group_usable() {
    let out = world_of(2, |pg| {
        let cpu = (Kind::Float, tch::Device::Cpu);
        let mut gathered = vec![Tensor::zeros([2], cpu)];
        let wrong_count = pg.all_gather(&mut gathered, &Tensor::zeros([2], cpu)).unwrap_err();
        let mut t = Tensor::zeros([2], cpu);
        let bad_root = pg.broadcast(&mut t, 2).unwrap_err();
        // Every other element: Gloo itself would reduce the first numel() elements of the storage
        // instead (a silent wrong answer), so the shim refuses it.
        let base = Tensor::arange(16, cpu);
        let mut strided = base.slice(0, 0, 16, 2);
        let strided = pg.all_reduce(&mut strided, ReduceOp::Sum).unwrap_err();
        let untouched = values(&base);
        // Nothing was sent, so the ranks are still in step.
        let mut ok = Tensor::ones([3], cpu);
        pg.all_reduce(&mut ok, ReduceOp::Sum).unwrap();
        (wrong_count, bad_root, strided, untouched, values(&ok))
    });
    for (rank, (wrong_count, bad_root, strided, untouched, ok)) in out.into_iter().enumerate() {
        let who = format!("rank {rank} of 2: ");
        assert!(
            wrong_count.0.starts_with(&who) && wrong_count.0.contains("all_gather: 1 output tensors for a group of 2"),
            "{wrong_count}"
        );
        assert!(bad_root.0.contains("broadcast: root 2 is not a rank"), "{bad_root}");
        assert!(
            strided.0.starts_with(&format!("{who}all_reduce: tensor 0 is not contiguous (sizes [8], strides [2])")),
            "{strided}"
        );
        assert_eq!(untouched, (0..16).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(ok, vec![2.0; 3]);
    }
}

#[test]
fn a_monitored_barrier_names_the_rank_that_never_arrives() {
    isolated("a_monitored_barrier_names_the_rank_that_never_arrives", || {
        let store = server();
        let port = store.port();
        let timeout = Duration::from_secs(2);
        let done = Arc::new(Barrier::new(3));
        let threads: Vec<_> = [1usize, 2]
            .into_iter()
            .map(|rank| {
                let done = done.clone();
                std::thread::spawn(move || {
                    let pg = join(port, "monitored", rank, 3, timeout).unwrap();
                    // Rank 1 arrives; rank 2 is stopped.
                    let r = if rank == 1 { Some(pg.monitored_barrier()) } else { None };
                    done.wait();
                    r
                })
            })
            .collect();
        let pg = join(port, "monitored", 0, 3, timeout).unwrap();
        let start = Instant::now();
        let e = pg.monitored_barrier().unwrap_err();
        assert!(start.elapsed() < timeout + Duration::from_secs(2), "waited {:?}", start.elapsed());
        assert_eq!(
            e.0,
            "rank 0 of 3: monitored_barrier: rank 2 of 3 did not reach the barrier within 2 s (stopped, stuck or gone)"
        );
        done.wait();
        for t in threads {
            if let Some(r) = t.join().unwrap() {
                // Rank 1 never hears back from rank 0: an error, not a hang.
                assert!(r.is_err());
            }
        }
    });
}

#[test]
fn gloo_on_this_hosts_default_device_connects() {
    // ProcessGroup::gloo as the trainer calls it: the device from GLOO_SOCKET_IFNAME, else this
    // host's name (loopback when it does not resolve).
    let store = server();
    let port = store.port();
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let client = Store::client("127.0.0.1", port, TIMEOUT).unwrap();
                let pg = ProcessGroup::gloo(&client, "default-device", rank, 2, TIMEOUT).unwrap();
                let mut t = Tensor::from_slice(&[rank as f32 + 1.0]);
                pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
                values(&t)
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), vec![3.0]);
    }
}

/// Rank 1 as a process of its own: spawned by the tests below (this test binary, this function
/// only, with MILES_C10D_TEST_PEER_PORT set); ignored in a plain run.
#[test]
#[ignore = "the peer process of the kill/stop tests, which run it"]
fn peer_process() {
    let port: u16 = std::env::var("MILES_C10D_TEST_PEER_PORT").expect("run by a test").parse().unwrap();
    let prefix = std::env::var("MILES_C10D_TEST_PEER_PREFIX").unwrap();
    let pg = join(port, &prefix, 1, 2, TIMEOUT).unwrap();
    let mut t = Tensor::ones([1024], (Kind::Float, tch::Device::Cpu));
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    // Waits here to be killed or stopped; exits on its own if the test forgot it.
    std::thread::sleep(Duration::from_secs(30));
}

fn spawn_peer(port: u16, prefix: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "peer_process", "--nocapture"])
        .env("MILES_C10D_TEST_PEER_PORT", port.to_string())
        .env("MILES_C10D_TEST_PEER_PREFIX", prefix)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_peer_process_killed_mid_run_fails_the_collective_at_once() {
    let store = server();
    let mut peer = spawn_peer(store.port(), "killed");
    let pg = join(store.port(), "killed", 0, 2, TIMEOUT).unwrap();
    let mut t = Tensor::ones([1024], (Kind::Float, tch::Device::Cpu));
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    peer.kill().unwrap(); // SIGKILL: no destructor runs, the kernel closes its sockets
    peer.wait().unwrap();
    let start = Instant::now();
    let e = pg.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(1), "waited {:?}", start.elapsed());
    assert!(e.0.starts_with("rank 0 of 2: all_reduce: "), "{e}");
}

#[test]
fn a_stopped_peer_process_times_the_collective_out() {
    let store = server();
    let mut peer = spawn_peer(store.port(), "stopped");
    let timeout = Duration::from_secs(2);
    let client = Store::client("127.0.0.1", store.port(), TIMEOUT).unwrap();
    let pg =
        ProcessGroup::gloo_on(&client, "stopped", 0, 2, timeout, &GlooDevice::Hostname("127.0.0.1".into())).unwrap();
    let mut t = Tensor::ones([1024], (Kind::Float, tch::Device::Cpu));
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    let stop = std::process::Command::new("kill").args(["-STOP", &peer.id().to_string()]).status().unwrap();
    assert!(stop.success());
    let start = Instant::now();
    let e = pg.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
    let waited = start.elapsed();
    peer.kill().unwrap(); // SIGKILL ends a stopped process too
    peer.wait().unwrap();
    assert!(waited >= Duration::from_millis(1900) && waited < timeout + Duration::from_secs(2), "waited {waited:?}");
    assert!(e.0.starts_with("rank 0 of 2: all_reduce: no answer within 2 s"), "{e}");
}
