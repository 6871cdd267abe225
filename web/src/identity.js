// The volunteer's key: who this browser profile is to the relay, across reloads, tabs, workers and sessions.
// An ECDSA P-256 key pair WebCrypto makes non-extractable (the private key never leaves the browser, not even to
// this page's scripts), kept in IndexedDB. A worker proves it at each join: it asks the relay for a challenge and
// signs "peertrain-join:" + challenge (the relay checks it: server/relay/volunteers.py). The volunteer is the sha256
// of the public key; anonymous unless the volunteer gives a display name and a team (kept in this browser and sent
// with each join). "Forget" deletes the key: the next join makes a new one, a stranger to the relay.
// Used by the page (identity.js's panel in "What you gave") and by each worker (worker.js, at its join).
const DB = "peertrain-volunteer";
const STORE = "keys";
const RECORD = "volunteer";
const SIGNED_PREFIX = "peertrain-join:";
const ALGORITHM = { name: "ECDSA", namedCurve: "P-256" };
const NAME = "peertrain.volunteer.name";
const TEAM = "peertrain.volunteer.team";

// The display name and team this browser remembers (the page sends them with each worker's join), "" where none.
// (The page's only: a worker has no localStorage.)
export function volunteerProfile() {
  try {
    return { name: localStorage.getItem(NAME) || "", team: localStorage.getItem(TEAM) || "" };
  } catch {
    return { name: "", team: "" };
  }
}

export function rememberProfile(name, team) {
  try {
    localStorage.setItem(NAME, name);
    localStorage.setItem(TEAM, team);
  } catch { /* storage refused: the join carries them this visit only */ }
}

function database() {
  return new Promise((resolve, reject) => {
    const opening = indexedDB.open(DB, 1);
    opening.onupgradeneeded = () => opening.result.createObjectStore(STORE);
    opening.onerror = () => reject(opening.error);
    opening.onsuccess = () => resolve(opening.result);
  });
}

async function keys(mode, use) {
  const db = await database();
  try {
    return await new Promise((resolve, reject) => {
      const request = use(db.transaction(STORE, mode).objectStore(STORE));
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
  } finally {
    db.close();
  }
}

const base64 = (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes)));
const hex = (bytes) => [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");

// The stored key, or null (none made yet, or IndexedDB refused: a private window may refuse it).
export async function storedKey() {
  try {
    return (await keys("readonly", (store) => store.get(RECORD))) || null;
  } catch {
    return null;
  }
}

// The key, made and stored on first use: { privateKey, publicKey (SPKI, base64), volunteer (its id) }.
export async function volunteerKey() {
  const stored = await storedKey();
  if (stored) return stored;
  const pair = await crypto.subtle.generateKey(ALGORITHM, false, ["sign", "verify"]);
  const spki = await crypto.subtle.exportKey("spki", pair.publicKey); // (a public key is always exportable)
  const record = { privateKey: pair.privateKey, publicKey: base64(spki),
    volunteer: hex(await crypto.subtle.digest("SHA-256", spki)).slice(0, 32), created: Date.now() };
  try {
    await keys("readwrite", (store) => store.add(record, RECORD)); // (add: two tabs opened at once keep one key)
  } catch {
    return (await storedKey()) || record;
  }
  return record;
}

export async function forgetKey() {
  await keys("readwrite", (store) => store.delete(RECORD));
}

// The join's "volunteer" object: the relay's challenge signed with the key the page made (null: this browser keeps
// no key, and the worker joins anonymously, as a peer of its own). A worker never makes a key: its page does, once,
// before any worker joins, so that a page's workers are one volunteer.
export async function volunteerProof(fetchChallenge, profile = {}) {
  const key = await storedKey();
  if (!key) return null;
  const { challenge } = await fetchChallenge();
  const signature = await crypto.subtle.sign({ name: "ECDSA", hash: "SHA-256" }, key.privateKey,
    new TextEncoder().encode(SIGNED_PREFIX + challenge));
  const proof = { public_key: key.publicKey, challenge, signature: base64(signature) };
  if (profile.name) proof.name = profile.name;
  if (profile.team) proof.team = profile.team;
  return proof;
}
