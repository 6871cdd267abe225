// "Try the model": the worker answers with the current global weights (between its units).
import { $, peer } from "./peer.js";
import { drawAnswer } from "./task_views.js";

// What to type, from the session's task (no hint: the task answers no prompts and the section is hidden).
export function showTry(session) {
  const hint = session.task.respond_hint;
  $("try-section").hidden = !hint;
  if (hint && !$("try-prompt").placeholder) { $("try-prompt").placeholder = hint; $("try-prompt").value = hint; }
}

export async function tryModel(event) {
  event.preventDefault();
  const prompt = $("try-prompt").value;
  $("try-answer").textContent = "asking the model (it answers between units)…";
  try {
    const answer = await peer.ask(prompt);
    peer.lastAnswer = answer;
    $("try-answer").textContent = answer.error ? `refused: ${answer.error}` : `${answer.text} (weights of round ${answer.round})`;
    drawAnswer($("try-canvas"), peer.session ? peer.session.task.name : "", answer);
  } catch (error) {
    $("try-answer").textContent = String(error.message || error);
  }
}
