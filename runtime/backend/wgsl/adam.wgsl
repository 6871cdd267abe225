// torch.optim.Adam / AdamW for one parameter, in place, bias-corrected with eps outside the sqrt.
// Params: [0] n, [1] flags (1 decoupled weight decay, 2 L2 weight decay), [2] 1 - lr * weight decay,
// [3] weight decay, [4] beta_1, [5] 1 - beta_1, [6] beta_2, [7] 1 - beta_2, [8] 1 / sqrt(1 - beta_2^t),
// [9] eps, [10] lr / (1 - beta_1^t).
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read_write> exp_avg: array<f32>;
@group(0) @binding(3) var<storage, read_write> exp_avg_sq: array<f32>;
@group(0) @binding(4) var<storage, read> grad: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let i = group_index(wid, nwg) * 256u + lid;
  if (i >= p[0]) { return; }
  let flags = p[1];
  var w = param[i];
  var g = grad[i];
  if ((flags & 1u) != 0u) { w = w * pf(2u); }
  if ((flags & 2u) != 0u) { g = g + pf(3u) * w; }
  let m = exp_avg[i] * pf(4u) + pf(5u) * g;
  let v = exp_avg_sq[i] * pf(6u) + pf(7u) * (g * g);
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  let denom = sqrt(v) * pf(8u) + pf(9u);
  param[i] = w - (m / denom) * pf(10u);
}
