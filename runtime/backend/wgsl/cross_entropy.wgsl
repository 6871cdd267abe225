// Cross-entropy per row: probs = softmax(logits), nll = log(sum exp(shifted)) - shifted[target], 0 for an
// ignored row (target 0xffffffff). Params: [0] rows, [1] width.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> probs: array<f32>;
@group(0) @binding(2) var<storage, read_write> nll: array<f32>;
@group(0) @binding(3) var<storage, read> logits: array<f32>;
@group(0) @binding(4) var<storage, read> targets: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let rows = p[0];
  let width = p[1];
  let row = group_index(wid, nwg);
  let r = min(row, rows - 1u);
  let base = r * width;
  var best = -3.402823e38;
  for (var k = lid; k < width; k = k + WG) { best = max(best, logits[base + k]); }
  best = group_max(best, lid);
  var acc = 0.0;
  for (var k = lid; k < width; k = k + WG) { acc = acc + exp(logits[base + k] - best); }
  let total = group_sum(acc, lid);
  if (row < rows) {
    for (var k = lid; k < width; k = k + WG) { probs[base + k] = exp(logits[base + k] - best) / total; }
    if (lid == 0u) {
      let t = targets[r];
      if (t == 0xffffffffu) {
        nll[r] = 0.0;
      } else {
        nll[r] = log(total) - (logits[base + t] - best);
      }
    }
  }
}
