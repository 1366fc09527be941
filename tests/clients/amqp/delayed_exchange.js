// The delayed-message plugin's README with Node's amqplib, through the bridge: an exchange of
// type x-delayed-message (x-delayed-type direct), a publish with x-delay. Prints one JSON
// object. Usage: node delayed_exchange.js PORT EXCHANGE QUEUE DELAY_MS
"use strict";
const amqp = require("amqplib");

const [port, exchange, queue, delayText] = process.argv.slice(2);
const delay = Number(delayText);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const conn = await amqp.connect(`amqp://guest:guest@127.0.0.1:${port}`);
  const ch = await conn.createConfirmChannel();
  await ch.assertExchange(exchange, "x-delayed-message", {
    durable: true, arguments: { "x-delayed-type": "direct" } });
  await ch.assertQueue(queue, { durable: true });
  await ch.bindQueue(queue, exchange, "k");
  const sent = Date.now();
  ch.publish(exchange, "k", Buffer.from("node later"), { headers: { "x-delay": delay } });
  await ch.waitForConfirms();
  const early = (await ch.get(queue, { noAck: true })) !== false;
  let m = false;
  while (!m && Date.now() < sent + delay + 15000) {
    m = await ch.get(queue, { noAck: true });
    if (!m) await sleep(20);
  }
  const out = { early, body: m ? m.content.toString() : null, waited_ms: Date.now() - sent,
                x_delay: m ? m.properties.headers["x-delay"] : null };
  await conn.close();
  console.log(JSON.stringify(out));
}

main().catch((err) => { console.log(JSON.stringify({ error: String(err) })); process.exit(1); });
