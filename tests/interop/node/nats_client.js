// Drives the npm `nats` 2.x client against mqhub; prints one JSON result line.
// Usage: node nats_client.js <port>
const { connect, StringCodec, headers, ErrorCode } = require("nats");

async function main() {
  const port = process.argv[2];
  const sc = StringCodec();
  const out = {};
  const nc = await connect({ servers: `127.0.0.1:${port}`, timeout: 5000 });
  out.server_version = nc.info.version;
  out.headers = nc.info.headers;

  // pub/sub with a wildcard and headers
  const sub = nc.subscribe("js.*", { max: 2 });
  const got = (async () => {
    const msgs = [];
    for await (const m of sub) {
      msgs.push({ subject: m.subject, data: sc.decode(m.data), h: m.headers ? m.headers.get("X-Id") : null });
    }
    return msgs;
  })();
  await nc.flush();
  const h = headers();
  h.set("X-Id", "42");
  nc.publish("js.a", sc.encode("one"), { headers: h });
  nc.publish("js.b", sc.encode("two"));
  out.pubsub = await got;

  // queue group responder + request/reply
  const svc = nc.subscribe("js.svc", { queue: "q" });
  (async () => { for await (const m of svc) { m.respond(sc.encode("re:" + sc.decode(m.data))); } })();
  await nc.flush();
  const r = await nc.request("js.svc", sc.encode("hi"), { timeout: 5000 });
  out.reply = sc.decode(r.data);

  // no responders -> 503
  try {
    await nc.request("js.nobody", sc.encode("x"), { timeout: 5000 });
    out.no_responders = "no error";
  } catch (err) {
    out.no_responders = err.code;
  }

  // mq9: create a mailbox, send, subscribe and receive the backlog in priority order
  const created = JSON.parse(sc.decode((await nc.request("$mq9.AI.MAILBOX.CREATE", sc.encode('{"type":"standard"}'), { timeout: 5000 })).data));
  const mid = created.mail_id;
  nc.publish(`$mq9.AI.INBOX.${mid}.normal`, sc.encode("n"));
  nc.publish(`$mq9.AI.INBOX.${mid}.urgent`, sc.encode("u"));
  await nc.flush();
  const box = nc.subscribe(`$mq9.AI.INBOX.${mid}.*`, { max: 2 });
  const mail = [];
  for await (const m of box) { mail.push(sc.decode(m.data)); }
  out.mailbox = mail;
  const q = JSON.parse(sc.decode((await nc.request(`$mq9.AI.MAILBOX.QUERY.${mid}`, sc.encode(JSON.stringify({ token: created.token })), { timeout: 5000 })).data));
  out.query_unread = q.unread;

  await nc.drain();
  console.log(JSON.stringify(out));
}

main().catch((err) => { console.error(err); process.exit(1); });
