//! How a policy's GEMMs compute (docs/precision.md).

use tch::{Kind, Tensor};

/// How a policy's GEMMs compute: libtorch's in the weights' kind, bf16 against fp32 weights, or
/// the batch-invariant kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gemm {
    Plain,
    Bf16,
    Invariant,
}

impl Gemm {
    /// `x W^T (+ bias)`, in fp32 under bf16 GEMMs (what attention, norms and the residual take).
    pub(crate) fn linear(self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
        match self {
            Gemm::Bf16 => self.linear_low(x, w, bias).to_kind(Kind::Float),
            _ => self.linear_low(x, w, bias),
        }
    }

    /// `linear`, its output left in bf16 under bf16 GEMMs: for an MLP's inner activations, whose
    /// elementwise ops (and their backward) then move half the bytes, as under autocast.
    pub(crate) fn linear_low(self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
        match self {
            Gemm::Invariant => crate::invariant::linear(x, w, bias),
            // Autocast by hand (tch's autocast picks fp16): the gradient flows back through the
            // casts into the fp32 weights.
            Gemm::Bf16 => {
                let bf =
                    |t: &Tensor| if t.kind() == Kind::BFloat16 { t.shallow_clone() } else { t.to_kind(Kind::BFloat16) };
                bf(x).linear(&bf(w), bias.map(bf).as_ref())
            }
            Gemm::Plain => x.linear(w, bias),
        }
    }
}
