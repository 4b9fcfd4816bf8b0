// BullMQ's side of `python -m bench peer_bullmq`: one command per run (its first argument),
// its arguments as one JSON object on stdin, its answer as one JSON line on stdout.
//
//   add      {redis, queue, due: [ms since the epoch, ...]}    delayed jobs, one per due time
//   work     {redis, queue, concurrency, napMs}                a worker until SIGTERM, then
//            how many jobs it ran
//   changes  {redis, queue, n, together}                       n delayed jobs due in 2 min, then
//            each one's change timed: even ones removed, odd ones moved (changeDelay), one
//            await at a time, or all sent together (Promise.all)
import { readFileSync } from "node:fs";
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const command = process.argv[2];
const args = JSON.parse(readFileSync(0, "utf8"));
const connection = new IORedis(args.redis, { maxRetriesPerRequest: null });

async function add() {
  const queue = new Queue(args.queue, { connection });
  const now = Date.now();
  const jobs = args.due.map((due) => ({
    name: "noop",
    data: { due }, // BullMQ zeroes a job's delay when it moves it to the wait list
    opts: { delay: Math.max(0, due - now) },
  }));
  for (let i = 0; i < jobs.length; i += 1000) {
    await queue.addBulk(jobs.slice(i, i + 1000));
  }
  await queue.close();
  return { added: jobs.length };
}

async function work() {
  const nap = args.napMs;
  let ran = 0;
  const worker = new Worker(
    args.queue,
    async () => {
      if (nap) await new Promise((resolve) => setTimeout(resolve, nap));
      ran += 1;
    },
    { connection, concurrency: args.concurrency },
  );
  await worker.waitUntilReady();
  console.log(JSON.stringify({ ready: true }));
  await new Promise((resolve) => process.once("SIGTERM", resolve));
  await worker.close();
  return { ran };
}

async function changes() {
  const queue = new Queue(args.queue, { connection });
  const jobs = await queue.addBulk(
    Array.from({ length: args.n }, () => ({ name: "noop", data: {}, opts: { delay: 120_000 } })),
  );
  const change = (job, i) => (i % 2 === 0 ? job.remove() : job.changeDelay(180_000));
  const started = process.hrtime.bigint();
  if (args.together) {
    await Promise.all(jobs.map(change));
  } else {
    for (const [i, job] of jobs.entries()) await change(job, i);
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await queue.close();
  return { seconds };
}

console.log(JSON.stringify(await { add, work, changes }[command]()));
await connection.quit();
