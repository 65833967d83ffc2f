//! The rates of the embedded backend on a GPU (docs/plan.md, "Step time on a GPU"): the work
//! `plan/embedded.rs` counts (matmul FLOPs, ATen ops, bytes), priced at the datasheet peaks of the GPU
//! a `local` cluster's `device` resolved to, times stated efficiencies (`Assumptions`). These are
//! assumptions: no run of miles on a GPU has been measured yet.

use crate::input::{Assumptions, MachineGpu, Precision};
use crate::time::Rate;

/// Datasheet peaks of one GPU kind, dense (without 2:4 sparsity).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Peaks {
    /// The kind, as the table names it ("H200 SXM").
    pub kind: &'static str,
    /// Words the CUDA driver's name holds, all of them ("NVIDIA H200 NVL": H200, NVL).
    words: &'static [&'static str],
    /// Dense BF16 tensor-core peak, FLOP/s.
    pub bf16: f64,
    /// FP32 peak without tensor cores (libtorch leaves TF32 off for matmuls), FLOP/s.
    pub fp32: f64,
    /// HBM bandwidth, bytes/s.
    pub hbm: f64,
    /// Not a datasheet: the name is not in `TABLE`.
    pub fallback: bool,
}

const fn peaks(kind: &'static str, words: &'static [&'static str], bf16_tf: f64, fp32_tf: f64, hbm_tb: f64) -> Peaks {
    Peaks { kind, words, bf16: bf16_tf * 1e12, fp32: fp32_tf * 1e12, hbm: hbm_tb * 1e12, fallback: false }
}

/// Public NVIDIA datasheets; the BF16 figures are the dense ones (the datasheets print twice
/// these "with sparsity"). First match wins, so a variant precedes its family.
/// - H200 SXM / NVL: "NVIDIA H200 Tensor Core GPU" datasheet: FP32 67 / 60 TFLOPS, BF16 tensor
///   core 1,979 / 1,671 TFLOPS with sparsity, 4.8 TB/s.
/// - H100 SXM / NVL / PCIe: "NVIDIA H100 Tensor Core GPU" datasheet: FP32 67 / 60 / 51 TFLOPS,
///   BF16 1,979 / 1,671 / 1,513 with sparsity, 3.35 / 3.9 / 2 TB/s. The driver names the SXM part
///   "NVIDIA H100 80GB HBM3".
/// - A100: "NVIDIA A100 Tensor Core GPU" datasheet: FP32 19.5 TFLOPS, BF16 312 TFLOPS dense;
///   80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s, 40GB 1,555 GB/s.
/// - L40S: "NVIDIA L40S" datasheet: FP32 91.6 TFLOPS, BF16 362.05 TFLOPS dense, 864 GB/s.
const TABLE: &[Peaks] = &[
    peaks("H200 NVL", &["H200", "NVL"], 835.5, 60.0, 4.8),
    peaks("H200 SXM", &["H200"], 989.5, 67.0, 4.8),
    peaks("H100 NVL", &["H100", "NVL"], 835.5, 60.0, 3.9),
    peaks("H100 PCIe", &["H100", "PCIE"], 756.5, 51.0, 2.0),
    peaks("H100 SXM", &["H100"], 989.5, 67.0, 3.35),
    peaks("A100 80GB PCIe", &["A100", "80GB", "PCIE"], 312.0, 19.5, 1.935),
    peaks("A100 80GB SXM", &["A100", "80GB"], 312.0, 19.5, 2.039),
    peaks("A100 40GB", &["A100"], 312.0, 19.5, 1.555),
    peaks("L40S", &["L40S"], 362.05, 91.6, 0.864),
];

/// A GPU the table does not know: below every GPU in it (FP32 10 TFLOP/s, BF16 100 TFLOP/s,
/// 0.5 TB/s), so the plan errs slow; not a datasheet.
const FALLBACK: Peaks =
    Peaks { kind: "unknown GPU", words: &[], bf16: 100e12, fp32: 10e12, hbm: 0.5e12, fallback: true };

/// The table's entry for a name as the CUDA driver gives it (case and punctuation ignored:
/// "NVIDIA A100-SXM4-80GB" holds A100 and 80GB), else the fallback.
pub(crate) fn peaks_of(name: &str) -> Peaks {
    let upper = name.to_ascii_uppercase();
    let words: Vec<&str> = upper.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    TABLE.iter().find(|p| p.words.iter().all(|w| words.contains(w))).copied().unwrap_or(FALLBACK)
}

/// The GPU the embedded process computes on (`local { device }` resolved to cuda:0).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Gpu {
    /// As the CUDA driver names it.
    pub name: String,
    /// Bytes, as the driver reports it.
    pub memory: u64,
    pub peaks: Peaks,
}

impl Gpu {
    pub(crate) fn new(g: &MachineGpu) -> Gpu {
        Gpu { name: g.name.clone(), memory: g.memory, peaks: peaks_of(&g.name) }
    }

    /// The dense peak GEMMs in `gemm` run at, and its name: bf16 (and fp16) on tensor cores,
    /// fp32 without them.
    pub(crate) fn peak(&self, gemm: Precision) -> (f64, &'static str) {
        match gemm {
            Precision::Fp32 => (self.peaks.fp32, "fp32 (no tensor cores, TF32 off)"),
            _ => (self.peaks.bf16, "bf16 tensor-core"),
        }
    }

    /// Where the peaks come from, in words.
    pub(crate) fn source(&self) -> String {
        if self.peaks.fallback {
            format!("{} is not in the plan's GPU table, so a conservative fallback (not a datasheet)", self.name)
        } else {
            format!("{} datasheet, dense", self.peaks.kind)
        }
    }

    /// The peak GEMMs in `gemm` run at and its efficiency, in words.
    pub(crate) fn gemm_note(&self, a: &Assumptions, gemm: Precision) -> String {
        let (peak, what) = self.peak(gemm);
        format!("{what} matmuls at {:.1} TFLOP/s x {:.0}%", peak / 1e12, a.embedded_gpu_gemm_efficiency * 100.0)
    }

    /// The HBM bandwidth the other ops write at and its efficiency, in words.
    pub(crate) fn hbm_note(&self, a: &Assumptions) -> String {
        format!("HBM {:.2} TB/s x {:.0}%", self.peaks.hbm / 1e12, a.embedded_gpu_bandwidth_efficiency * 100.0)
    }
}

/// The embedded backend's rates on `g` with GEMMs in `gemm`.
pub(crate) fn rate(a: &Assumptions, g: &Gpu, gemm: Precision) -> Rate {
    Rate {
        flops_per_s: g.peak(gemm).0 * a.embedded_gpu_gemm_efficiency,
        kernel_s: a.embedded_gpu_kernel_s,
        bytes_per_s: g.peaks.hbm * a.embedded_gpu_bandwidth_efficiency,
        sync_s: a.embedded_gpu_sync_s,
    }
}

/// What an estimate priced on `g` assumed.
pub(crate) fn rate_note(a: &Assumptions, g: &Gpu, gemm: Precision) -> String {
    format!(
        "on the GPU {} ({}): {}, other ops at {}, {:.0} us per op (eager libtorch's host-side launch), {:.0} us per sampled token's logits read back; datasheet assumptions, not measured on a GPU",
        g.name,
        g.source(),
        g.gemm_note(a, gemm),
        g.hbm_note(a),
        a.embedded_gpu_kernel_s * 1e6,
        a.embedded_gpu_sync_s * 1e6
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::MachineGpu;

    fn gpu(name: &str) -> Gpu {
        Gpu::new(&MachineGpu { index: 0, name: name.into(), memory: 80 << 30, sm: "sm_90".into() })
    }

    #[test]
    fn known_gpus_take_their_datasheet_peaks() {
        let a = Assumptions::default();
        let h200 = gpu("NVIDIA H200");
        assert_eq!((h200.peaks.kind, h200.peaks.fallback), ("H200 SXM", false));
        let r = rate(&a, &h200, Precision::Bf16);
        assert_eq!(r.flops_per_s, 989.5e12 * 0.5);
        assert_eq!(r.bytes_per_s, 4.8e12 * 0.7);
        assert_eq!((r.kernel_s, r.sync_s), (10e-6, 20e-6));
        // The driver's names of each kind in the table.
        for (name, kind) in [
            ("NVIDIA H100 80GB HBM3", "H100 SXM"),
            ("NVIDIA H100 PCIe", "H100 PCIe"),
            ("NVIDIA H100 NVL", "H100 NVL"),
            ("NVIDIA H200 NVL", "H200 NVL"),
            ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
            ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
            ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
            ("NVIDIA L40S", "L40S"),
        ] {
            assert_eq!(gpu(name).peaks.kind, kind, "{name}");
        }
        assert!(rate_note(&a, &h200, Precision::Bf16).contains("H200 SXM datasheet, dense"));
        assert!(rate_note(&a, &h200, Precision::Bf16).contains("not measured on a GPU"));
    }

    #[test]
    fn an_unknown_gpu_falls_back_and_says_so() {
        let a = Assumptions::default();
        // GH200 holds "H200" only inside a word: not an H200.
        for name in ["NVIDIA GH200 480GB", "NVIDIA GeForce RTX 4090", ""] {
            let g = gpu(name);
            assert!(g.peaks.fallback, "{name}");
            assert!(TABLE.iter().all(|p| p.bf16 > g.peaks.bf16 && p.fp32 > g.peaks.fp32 && p.hbm > g.peaks.hbm));
        }
        let note = rate_note(&a, &gpu("NVIDIA GH200 480GB"), Precision::Fp32);
        assert!(
            note.contains("is not in the plan's GPU table, so a conservative fallback (not a datasheet)"),
            "{note}"
        );
    }

    #[test]
    fn bf16_and_fp32_take_different_peaks() {
        let a = Assumptions::default();
        let g = gpu("NVIDIA A100-SXM4-80GB");
        assert_eq!(rate(&a, &g, Precision::Bf16).flops_per_s, 312e12 * 0.5);
        assert_eq!(rate(&a, &g, Precision::Fp32).flops_per_s, 19.5e12 * 0.5);
        assert_eq!(rate(&a, &g, Precision::Bf16).bytes_per_s, rate(&a, &g, Precision::Fp32).bytes_per_s);
        assert!(rate_note(&a, &g, Precision::Fp32)
            .contains("fp32 (no tensor cores, TF32 off) matmuls at 19.5 TFLOP/s x 50%"));
        // Efficiencies are assumptions a plan input overrides.
        let a = Assumptions { embedded_gpu_gemm_efficiency: 0.25, ..a };
        assert_eq!(rate(&a, &g, Precision::Bf16).flops_per_s, 312e12 * 0.25);
    }
}
