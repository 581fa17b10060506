// A second, independent NATS client (the npm `nats` package, v2) using a subscriber credential
// of `hpc-ds1 token nats`: tests/infra/test_nats_subscriber.py runs it with node.
// $SUBSCRIBER_ARGS: {"url", "user", "password", "inbox_prefix", "stream", "prefix", "consumer",
// "mode": "read" | "connect"}. Prints one JSON line per step on stdout.
const { connect, AckPolicy, DeliverPolicy, StringCodec } = require("nats");

const args = JSON.parse(process.env.SUBSCRIBER_ARGS);
const sc = StringCodec();
const say = (what) => console.log(JSON.stringify(what));

async function refused(step) {
  try {
    await step();
    return false;
  } catch (error) {
    return String(error.code || error.message || error);
  }
}

(async () => {
  let nc;
  try {
    nc = await connect({
      servers: args.url,
      user: args.user,
      pass: args.password,
      inboxPrefix: args.inbox_prefix,
      reconnect: false,
      timeout: 3000,
    });
  } catch (error) {
    say({ connected: false, error: String(error.code || error.message) });
    return;
  }
  if (args.mode === "connect") {
    say({ connected: true });
    await nc.close();
    return;
  }
  // Live: subscribe, say so, wait for the event the test appends.
  const live = nc.subscribe(`${args.prefix}.>`, { max: 1 });
  await nc.flush();
  say({ ready: true });
  for await (const m of live) {
    say({ live: { subject: m.subject, data: sc.decode(m.data) } });
  }
  // Replay from sequence 1 through its own consumer, acked.
  const jsm = await nc.jetstreamManager({ timeout: 2000 });
  const js = nc.jetstream({ timeout: 2000 });
  const info = await jsm.streams.info(args.stream);
  await jsm.consumers.add(args.stream, {
    durable_name: args.consumer,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.StartSequence,
    opt_start_seq: 1,
  });
  const consumer = await js.consumers.get(args.stream, args.consumer);
  const replayed = [];
  while (replayed.length < info.state.messages) {
    const batch = await consumer.fetch({ max_messages: 100, expires: 3000 });
    for await (const m of batch) {
      replayed.push({ seq: m.seq, subject: m.subject, data: sc.decode(m.data) });
      await m.ackAck();
    }
  }
  say({ replayed, last: info.state.last_seq });
  await jsm.consumers.delete(args.stream, args.consumer);
  // Refused: append, purge, other consumers, the KV bucket and the object store.
  say({
    refused: {
      publish: await refused(() => js.publish(`${args.prefix}.device.forged.registered`, sc.encode("{}"), { timeout: 1000 })),
      purge: await refused(() => jsm.streams.purge(args.stream)),
      other_consumer: await refused(() => jsm.consumers.info(args.stream, "other")),
      kv: await refused(async () => (await js.views.kv("SUBTEST_KV", { bindOnly: true })).get("k")),
      object_store: await refused(async () => (await js.views.os("SUBTEST_OBJ")).get("m")),
    },
  });
  await nc.close();
})().catch((error) => {
  say({ failed: String(error.stack || error) });
  process.exit(1);
});
