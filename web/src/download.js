// "Download the model": a public link, or a form that sends the admin token (kept in this page's memory only).
import { $, peer } from "./peer.js";

let adminToken = null; // typed into the page, kept in memory only

export function showDownload(session) {
  $("download-public").hidden = !session.public_model;
  $("download-form").hidden = Boolean(session.public_model);
}

export async function download(event) {
  event.preventDefault();
  adminToken = $("admin-token").value || adminToken;
  $("admin-token").value = "";
  $("download-status").textContent = "downloading…";
  const response = await fetch("/api/model", { headers: adminToken ? { Authorization: `Bearer ${adminToken}` } : {} });
  if (!response.ok) {
    let detail = {};
    try { detail = await response.json(); } catch { /* not JSON */ }
    $("download-status").textContent = `refused: ${detail.message || response.status}`;
    peer.downloaded = { ok: false, status: response.status };
    return;
  }
  const blob = await response.blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = "model.safetensors";
  link.click();
  URL.revokeObjectURL(link.href);
  peer.downloaded = { ok: true, bytes: blob.size };
  $("download-status").textContent = `downloaded ${(blob.size / 1e6).toFixed(2)} MB`;
}
