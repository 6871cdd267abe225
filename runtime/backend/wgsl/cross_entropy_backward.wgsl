// dlogits = (probs - onehot(target)) * grad / count on counted rows, 0 on ignored rows.
// Params: [0] elements, [1] width, [2] count (as f32). grad is a one-element buffer.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> probs: array<f32>;
@group(0) @binding(3) var<storage, read> targets: array<u32>;
@group(0) @binding(4) var<storage, read> grad: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let i = group_index(wid, nwg) * 256u + lid;
  if (i >= p[0]) { return; }
  let row = i / p[1];
  let col = i % p[1];
  let t = targets[row];
  if (t == 0xffffffffu) {
    out[i] = 0.0;
    return;
  }
  let scale = grad[0] / pf(2u);
  out[i] = (probs[i] - select(0.0, 1.0, col == t)) * scale;
}
