// Task drawings for "Try the model", keyed by task name, so the generic page knows no task by name. A drawing
// plays an answer's episode frames on the canvas; a new task whose frames mean something else adds its own here.
import * as cartpole from "./drawings/cartpole.js";

const DRAWINGS = new Map([["cartpole", cartpole.drawEpisode]]);

// Draws the answer's frames (if it has any) with its task's drawing. Frames from a task without a drawing of
// its own are drawn as a cart and pole: the task's respond contract (docs/tasks/writing.md) names them [[x, angle], ...].
export function drawAnswer(canvas, taskName, answer) {
  if (!answer.frames) return;
  (DRAWINGS.get(taskName) || cartpole.drawEpisode)(canvas, answer.frames);
}
