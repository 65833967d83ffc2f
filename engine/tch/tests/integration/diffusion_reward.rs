//! The diffusion domain, its rewards (the trained classifier and the analytic ones) and the SVG
//! grid: determinism, accuracy, round trips and the refusals a user can meet.

use miles_runtime::rng::Rng;
use miles_runtime::E_NONFINITE;
use miles_tch::diffusion::domain::{Domain, SHAPES};
use miles_tch::diffusion::grid::write_grid_svg;
use miles_tch::diffusion::reward::{Analytic, Classifier};
use std::time::{Duration, Instant};
use tch::Tensor;

/// Tests run in parallel threads: one intra-op thread each avoids OpenMP oversubscription.
fn one_thread() {
    tch::set_num_threads(1);
}

fn vals(x: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(x.reshape([-1])).unwrap()
}

fn image(px: &[f32], h: i64, w: i64) -> Tensor {
    Tensor::from_slice(px).view([1, 1, h, w])
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-6, "{a:?} vs {b:?}");
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("miles-diffusion-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn domain_draws_repeat_per_seed_and_differ_across_classes() {
    one_thread();
    let d = Domain::default();
    assert_eq!((d.side, d.conditions), (16, 8));
    let conds = [0, 1, 2, 3, 4, 5, 6, 7, 3];
    let a = d.batch(&conds, &mut Rng::new(11));
    assert_eq!(a.size(), [9, 1, 16, 16]);
    assert_eq!(vals(&a), vals(&d.batch(&conds, &mut Rng::new(11))));
    assert_ne!(vals(&a), vals(&d.batch(&conds, &mut Rng::new(12))));
    assert!(vals(&a).iter().all(|v| (-1.0..=1.0).contains(v)));

    // Class means over many draws: every pair of classes differs by twice what two or more
    // independent means of one class differ by (the sampling noise of the comparison).
    let n = 256;
    let mean_of = |c: i64, stream: u64| {
        let x = d.batch(&vec![c; n], &mut Rng::derived(5, "means", stream));
        vals(&x.mean_dim(0, false, tch::Kind::Float))
    };
    let mad = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32;
    let means: Vec<Vec<f32>> = (0..8).map(|c| mean_of(c, c as u64)).collect();
    let within = (0..8).map(|c| mad(&means[c], &mean_of(c as i64, 100 + c as u64))).fold(0f32, f32::max);
    let mut least = f32::MAX;
    for i in 0..8 {
        for j in i + 1..8 {
            let between = mad(&means[i], &means[j]);
            assert!(
                between > 0.05 && between > 2.0 * within,
                "{} vs {}: {between} (within a class: {within})",
                SHAPES[i],
                SHAPES[j]
            );
            least = least.min(between);
        }
    }
    eprintln!("class means: least difference between two classes {least:.3}, most within one {within:.3}");

    // The held-out list is fixed by its seed and balanced.
    let e = d.eval_pairs(16, 3);
    assert_eq!(e, d.eval_pairs(16, 3));
    assert_eq!(d.eval_conditions(16, 3), (0..16).map(|i| i % 8).collect::<Vec<i64>>());
    assert_ne!(e[0].1, e[1].1);
}

#[test]
fn the_classifier_learns_the_domain_and_round_trips() {
    one_thread();
    let d = Domain::default();
    let t0 = Instant::now();
    let (c, acc) = Classifier::train_on_domain(&d, 300, 32, 3e-3, 7).unwrap();
    let train_time = t0.elapsed();
    eprintln!("classifier: accuracy {acc:.3} on fresh samples after 300 steps of 32, {train_time:.2?} (one thread)");
    assert!(acc >= 0.9, "accuracy {acc}");

    // Scores are probabilities, high for the intended class and low for another one.
    let conds: Vec<i64> = (0..32).map(|i| i % 8).collect();
    let x = d.batch(&conds, &mut Rng::new(99));
    let t1 = Instant::now();
    let right = c.score(&x, &conds).unwrap();
    eprintln!("scoring 32 images: {:.2?}", t1.elapsed());
    let wrong: Vec<i64> = conds.iter().map(|c| (c + 1) % 8).collect();
    let wrong = c.score(&x, &wrong).unwrap();
    assert!(right.iter().chain(&wrong).all(|p| (0.0..=1.0).contains(p)));
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    assert!(mean(&right) > 0.7 && mean(&wrong) < 0.2, "{} {}", mean(&right), mean(&wrong));
    // A temperature above 1 grades the scores between chance and certainty, keeping their order.
    let mut soft = Classifier::load(
        &{
            let d = temp_dir("soft");
            c.save(&d.join("c.safetensors")).unwrap();
            d.join("c.safetensors")
        },
        16,
        8,
    )
    .unwrap();
    soft.temperature = 8.0;
    let graded = soft.score(&x, &conds).unwrap();
    assert!(mean(&graded) < mean(&right) && mean(&graded) > 1.0 / 8.0, "{}", mean(&graded));

    let dir = temp_dir("classifier");
    let path = dir.join("reward.safetensors");
    c.save(&path).unwrap();
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "a temp file was left beside the classifier");
    let back = Classifier::load(&path, 16, 8).unwrap();
    assert_eq!(back.params().len(), c.params().len());
    for ((n1, t1), (n2, t2)) in c.params().iter().zip(back.params()) {
        assert_eq!(n1, n2);
        let (a, b) = (vals(t1), vals(t2));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{n1} changed in the round trip");
    }
    assert_eq!(back.score(&x, &conds).unwrap(), right);

    // A file for another image size or class count is refused, naming the file.
    let e = Classifier::load(&path, 16, 4).unwrap_err();
    assert!(e.message.contains("reward.safetensors") && e.message.contains("fc2.weight"), "{}", e.message);
    let e = Classifier::load(&dir.join("missing.safetensors"), 16, 8).unwrap_err();
    assert!(e.message.contains("missing.safetensors"), "{}", e.message);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_extra_cost_is_slept_after_the_real_work() {
    one_thread();
    let c = Classifier::init(16, 8, 1).with_extra_cost(Duration::from_millis(50));
    let x = Domain::default().batch(&[1, 2], &mut Rng::new(1));
    let t = Instant::now();
    let s = c.score(&x, &[1, 2]).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert_eq!(s, Classifier::init(16, 8, 1).score(&x, &[1, 2]).unwrap());
}

#[test]
fn the_classifier_refuses_images_of_another_size() {
    one_thread();
    let c = Classifier::init(16, 8, 1);
    let small = Tensor::zeros([4, 1, 8, 8], (tch::Kind::Float, tch::Device::Cpu));
    let e = c.check_input(&small).unwrap_err();
    assert_eq!(e.message, "the reward model reads [B, 1, 16, 16] images; the denoiser makes [B, 1, 8, 8]");
    assert_eq!(c.score(&small, &[0, 0, 0, 0]).unwrap_err().message, e.message);
    let flat = Tensor::zeros([4, 256], (tch::Kind::Float, tch::Device::Cpu));
    assert!(c.check_input(&flat).unwrap_err().message.contains("[4, 256]"));
    assert!(c.check_input(&Tensor::zeros([2, 1, 16, 16], (tch::Kind::Float, tch::Device::Cpu))).is_ok());
}

#[test]
fn analytic_rewards_match_hand_computed_values() {
    one_thread();
    let white = image(&[1.0; 4], 2, 2);
    // Top row white, bottom row black.
    let half = image(&[1.0, 1.0, -1.0, -1.0], 2, 2);
    let corner = image(&[1.0, -1.0, -1.0, -1.0], 2, 2);
    let grey = image(&[0.0; 4], 2, 2);
    let batch = Tensor::cat(&[&white, &half, &corner, &grey], 0);

    close(&Analytic::Brightness.score(&batch).unwrap(), &[1.0, 0.5, 0.25, 0.5]);
    // Population std: half black and half white is 1; one white pixel of four is sqrt(3)/2.
    close(&Analytic::Contrast.score(&batch).unwrap(), &[0.0, 1.0, 3f32.sqrt() / 2.0, 0.0]);
    // Centre (0.5, 0.5); a corner is sqrt(0.5) away. The half image's centroid is (0.5, 0):
    // 0.5 from the centre, so 1 - 0.5 / sqrt(0.5) = 1 - sqrt(0.5).
    close(&Analytic::CenterMass.score(&batch).unwrap(), &[1.0, 1.0 - 0.5f32.sqrt(), 0.0, 1.0]);
    assert_eq!(Analytic::CenterMass.score(&image(&[-1.0; 4], 2, 2)).unwrap(), [0.0]);
    assert!(Analytic::Brightness.score(&Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu))).is_err());
}

#[test]
fn nonfinite_images_are_refused_by_index() {
    one_thread();
    let d = Domain::default();
    let x = d.batch(&[0, 1, 2, 3], &mut Rng::new(4));
    let mut px = vals(&x);
    px[2 * 256 + 17] = f32::NAN;
    let bad = Tensor::from_slice(&px).view([4, 1, 16, 16]);
    let c = Classifier::init(16, 8, 1);
    let e = c.score(&bad, &[0, 1, 2, 3]).unwrap_err();
    assert_eq!(e.code, E_NONFINITE);
    assert!(e.message.contains("image 2"), "{}", e.message);
    px[2 * 256 + 17] = 0.0;
    px[3 * 256] = f32::INFINITY;
    let bad = Tensor::from_slice(&px).view([4, 1, 16, 16]);
    for a in [Analytic::Brightness, Analytic::Contrast, Analytic::CenterMass] {
        assert!(a.score(&bad).unwrap_err().message.contains("image 3"), "{a:?}");
    }
}

#[test]
fn the_grid_is_an_svg_with_one_rect_per_pixel_written_atomically() {
    one_thread();
    let d = Domain::default();
    let conds: Vec<i64> = (0..10).map(|i| i % 8).collect();
    let x = d.batch(&conds, &mut Rng::new(8));
    let dir = temp_dir("grid");
    let path = dir.join("samples.svg");
    write_grid_svg(&path, &x, 4, "step 3 <cond & class>").unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<rect").count(), 10 * 16 * 16);
    assert_eq!(svg.matches("<g ").count(), 10);
    assert_eq!(svg.matches("<g ").count(), svg.matches("</g>").count());
    assert!(svg.contains("shape-rendering=\"crispEdges\""));
    assert!(svg.contains("step 3 &lt;cond &amp; class&gt;"));
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["samples.svg"], "a temp file was left beside the grid");
    eprintln!("grid of 10 16x16 images: {} bytes", svg.len());

    // Rewriting replaces the file whole.
    write_grid_svg(&path, &x.narrow(0, 0, 2), 4, "two").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap().matches("<rect").count(), 2 * 256);
    assert!(write_grid_svg(&dir.join("no/such/dir.svg"), &x, 4, "t").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
