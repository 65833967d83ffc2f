//! Supervised fine-tuning: masked cross-entropy on the answers, gradients accumulated over
//! micro-batches, one optimizer step per batch.

use super::loss::token_logprobs;
use super::moe::add_aux_loss;
use super::pack::pack;
use super::TchTrainer;
use crate::moe::Route;
use miles_runtime::tasks::TokenId;
use miles_runtime::{RunError, SftStats};
use tch::Kind;

impl TchTrainer {
    pub fn train_sft_impl(&mut self, batch: &[(Vec<TokenId>, Vec<TokenId>)], lr: f64) -> Result<SftStats, RunError> {
        let micro = self.spec.micro_batch.max(1);
        let total: f64 = batch.iter().map(|(_, a)| a.len() as f64).sum::<f64>().max(1.0);
        // The route's load-balancing loss sums the MoE layers': its weight takes their mean.
        let cfg = &self.policy.cfg;
        let layers = cfg.moe.as_ref().map_or(1, |c| c.moe_layers(cfg.n_layers).max(1)) as f64;
        self.zero_grad();
        let mut loss_acc = 0f64;
        // In a data-parallel group this rank trains micro-batches k % world == rank; the loss's
        // denominators are the batch's, so the summed gradients are the whole batch's.
        let mut local = Ok(());
        for (k, chunk) in batch.chunks(micro).enumerate() {
            if !self.trains_micro(k) {
                continue;
            }
            let pr: Vec<&[TokenId]> = chunk.iter().map(|(p, _)| p.as_slice()).collect();
            let rs: Vec<&[TokenId]> = chunk.iter().map(|(_, a)| a.as_slice()).collect();
            let pk = pack(&pr, &rs, None);
            self.set_training(true);
            let mut route = self.policy.cfg.moe.as_ref().map(|_| Route::for_batch(None, &pk.valid, true));
            let (lp, _) = token_logprobs(&self.policy, &pk, 1.0, route.as_mut());
            self.set_training(false);
            let loss = -(lp * &pk.mask).sum(Kind::Float) / total;
            let aux = route.and_then(|r| r.aux);
            let loss = add_aux_loss(loss, aux, self.policy.cfg.moe.as_ref(), chunk.len(), batch.len() as f64 * layers);
            match self.finite_loss(&loss, "SFT loss is NaN/infinite") {
                Ok(l) => loss_acc += l,
                Err(e) => {
                    local = Err(e);
                    break;
                }
            }
            loss.backward();
        }
        let norm = self.optimizer_step(lr, local)?;
        if let Some(dp) = &self.dp {
            dp.reduce_stats(&mut [&mut loss_acc], &mut [])?;
        }
        Ok(SftStats { loss: loss_acc, grad_norm: norm, tokens: total as u64 })
    }
}
