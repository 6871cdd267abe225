// CartPole's episode in "Try the model": frames of [cart position, pole angle], played back on the canvas.
export function drawEpisode(canvas, frames) {
  canvas.hidden = false;
  const context = canvas.getContext("2d");
  let index = 0;
  const draw = () => {
    const [x, theta] = frames[Math.min(index, frames.length - 1)];
    context.clearRect(0, 0, canvas.width, canvas.height);
    const cx = canvas.width / 2 + (x / 2.4) * (canvas.width / 2 - 20);
    context.fillStyle = "#444";
    context.fillRect(0, canvas.height - 20, canvas.width, 2);
    context.fillRect(cx - 20, canvas.height - 34, 40, 14);
    context.strokeStyle = "#d9822b";
    context.lineWidth = 5;
    context.beginPath();
    context.moveTo(cx, canvas.height - 34);
    context.lineTo(cx + 70 * Math.sin(theta), canvas.height - 34 - 70 * Math.cos(theta));
    context.stroke();
    index += 1;
    if (index < frames.length) requestAnimationFrame(draw);
  };
  draw();
}
