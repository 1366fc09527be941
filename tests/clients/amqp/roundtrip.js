// One AMQP 0-9-1 round trip through the bridge with Node's amqplib, for tests/integration:
// confirms, a transaction rolled back then committed, a delayed publish, a nack with requeue
// (its redelivery counted) and a refused publish. Prints one JSON object.
// Usage: node roundtrip.js PORT QUEUE
"use strict";
const amqp = require("amqplib");

const [port, queue] = process.argv.slice(2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function get(channel, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const m = await channel.get(queue, { noAck: false });
    if (m) return m;
    await sleep(20);
  }
  return null;
}

function count(m) {
  return m.properties.headers.JMSXDeliveryCount;
}

async function main() {
  const out = {};
  const conn = await amqp.connect(`amqp://guest:guest@127.0.0.1:${port}`);
  const confirm = await conn.createConfirmChannel();
  await confirm.assertQueue(queue, { durable: true });
  confirm.publish("", queue, Buffer.from("plain"), { headers: { n: 1 } });
  await confirm.waitForConfirms();
  let m = await get(confirm, 5000);
  out.plain = m && { body: m.content.toString(), count: count(m), n: m.properties.headers.n };
  confirm.nack(m, false, true);
  m = await get(confirm, 5000);
  out.nacked = m && { body: m.content.toString(), count: count(m) };
  confirm.ack(m);

  const tx = await conn.createChannel();
  await tx.assertQueue(queue, { durable: true });
  await tx.checkQueue(queue);
  // amqplib has no tx helpers: Tx.Select/Commit/Rollback through its channel RPC.
  const defs = require("amqplib/lib/defs");
  const txCall = (name) => tx.rpc(defs[name], {}, defs[name + "Ok"]);
  await txCall("TxSelect");
  tx.sendToQueue(queue, Buffer.from("rolled back"));
  await txCall("TxRollback");
  tx.sendToQueue(queue, Buffer.from("committed"));
  await txCall("TxCommit");
  m = await get(confirm, 5000);
  out.tx = m && m.content.toString();
  if (m) confirm.ack(m);
  out.tx_left = (await confirm.checkQueue(queue)).messageCount;

  const sent = Date.now();
  confirm.publish("", queue, Buffer.from("later"), { headers: { "x-delay": 600 } });
  await confirm.waitForConfirms();
  out.early = (await confirm.get(queue, { noAck: true })) !== false;
  m = await get(confirm, 10000);
  out.delayed = m && { body: m.content.toString(), waited_ms: Date.now() - sent,
                       count: count(m) };
  if (m) confirm.ack(m);

  const refused = await conn.createConfirmChannel();
  const closed = new Promise((resolve) => refused.on("error", resolve));
  refused.publish("", queue, Buffer.from("no"), { headers: { "x-delay": -5 } });
  const error = await Promise.race([closed, sleep(5000)]);
  out.refused = error ? { code: error.code, message: error.message } : null;
  await confirm.close();
  await conn.close();
  console.log(JSON.stringify(out));
}

main().catch((err) => {
  console.log(JSON.stringify({ error: String(err && err.stack || err) }));
  process.exit(1);
});
