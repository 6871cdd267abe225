// Helpers shared by every kernel (prepended to each kernel's source). Binding 0 of every kernel is its
// parameter block: 64 u32 words in a shared arena, floats stored as their bit patterns.
const WG: u32 = 64u;
var<workgroup> scratch: array<f32, 64>;

// Linear workgroup index of a 2-D dispatch (one dimension is capped at 65535 workgroups).
fn group_index(wid: vec3u, nwg: vec3u) -> u32 {
  return wid.x + wid.y * nwg.x;
}

fn pf(i: u32) -> f32 {
  return bitcast<f32>(p[i]);
}

// Sum / max of one value per invocation over a 64-invocation workgroup; call in uniform control flow.
fn group_sum(v: f32, lid: u32) -> f32 {
  scratch[lid] = v;
  workgroupBarrier();
  for (var s = 32u; s > 0u; s = s >> 1u) {
    if (lid < s) {
      scratch[lid] = scratch[lid] + scratch[lid + s];
    }
    workgroupBarrier();
  }
  let total = scratch[0];
  workgroupBarrier();
  return total;
}

fn group_max(v: f32, lid: u32) -> f32 {
  scratch[lid] = v;
  workgroupBarrier();
  for (var s = 32u; s > 0u; s = s >> 1u) {
    if (lid < s) {
      scratch[lid] = max(scratch[lid], scratch[lid + s]);
    }
    workgroupBarrier();
  }
  let best = scratch[0];
  workgroupBarrier();
  return best;
}

// tanh without the cancellation of exp-based formulas near 0, and without overflow for large |x|.
fn stable_tanh(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.1) {
    let x2 = x * x;
    return x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
  }
  let e = exp(-2.0 * min(a, 20.0));
  return sign(x) * (1.0 - e) / (1.0 + e);
}
