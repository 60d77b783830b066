// nsqjs interop: publish (single and array -> MPUB) with a Writer, consume with a Reader
// (FIN, and one REQ that must come back), then print one JSON line with what happened.
// Usage: node nsq_roundtrip.js HOST TCP_PORT TOPIC COUNT [plain|deflate|snappy]
'use strict'
const nsq = require('nsqjs')

const [host, port, topic, countArg, compression] = process.argv.slice(2)
const count = parseInt(countArg, 10)
const connOptions = {}
if (compression === 'deflate') connOptions.deflate = true
if (compression === 'snappy') connOptions.snappy = true
const result = { published: 0, received: [], attempts: {}, errors: [] }
const done = (code) => {
  console.log(JSON.stringify(result))
  process.exit(code)
}
setTimeout(() => { result.errors.push('timeout'); done(2) }, 20000)

const reader = new nsq.Reader(topic, 'nodejs', {
  nsqdTCPAddresses: [`${host}:${port}`],
  maxInFlight: 50,
  requeueDelay: 0,
  ...connOptions
})
reader.on('error', (err) => result.errors.push(String(err)))
reader.on('message', (msg) => {
  const body = msg.body.toString()
  result.attempts[body] = msg.attempts
  if (body === 'm0' && msg.attempts === 1) {
    msg.requeue(0, false)
    return
  }
  result.received.push(body)
  msg.finish()
  maybeDone()
})
// finished once every message was both confirmed to the writer and received by the reader
// (a message can reach the reader before its OK reaches the writer)
const maybeDone = () => {
  if (result.published === count && new Set(result.received).size === count) {
    reader.close()
    done(0)
  }
}
reader.on('nsqd_connected', () => {
  const writer = new nsq.Writer(host, parseInt(port, 10), connOptions)
  writer.on('error', (err) => result.errors.push(String(err)))
  writer.on('ready', () => {
    const negotiated = (writer.conn && writer.conn.statemachine && writer.conn.statemachine.identifyResponse) || {}
    result.negotiated = { snappy: !!negotiated.snappy, deflate: !!negotiated.deflate }
    writer.publish(topic, 'm0', (err) => {
      if (err) { result.errors.push(String(err)); return }
      result.published += 1
      const rest = []
      for (let i = 1; i < count; i++) rest.push(`m${i}`)
      writer.publish(topic, rest, (err2) => {
        if (err2) { result.errors.push(String(err2)); return }
        result.published += rest.length
        writer.close()
        maybeDone()
      })
    })
  })
  writer.connect()
})
reader.connect()
