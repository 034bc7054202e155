//! The SQLite store's administration: inspecting, listing, clearing and
//! deleting records, the sweeper, readiness, the pool's figures, closing
//! the file at a graceful stop, and the wake-up relay that reads other
//! processes' announcements.

use super::*;

/// What key administration reads of a record.
#[derive(Debug, sqlx::FromRow)]
struct InfoRow {
    #[sqlx(flatten)]
    head: Head,
    route: String,
    scope: Vec<u8>,
    key: String,
    created_at: i64,
    updated_at: i64,
    status: Option<i64>,
    body_bytes: Option<i64>,
}

const INFO_COLUMNS: &str = "route, scope, key, state, token, attempt, lease_until, expires_at,
    held_reason, inquiries, inquiring_since, created_at, updated_at, status, length(body) AS body_bytes
    FROM idemgate_records";

fn wall(us: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl InfoRow {
    fn into_info(self) -> Result<RecordInfo, StoreError> {
        let key = RecordKey {
            route: self.route,
            scope: self.scope,
            key: self.key,
        };
        RecordInfo::from_parts(
            &key,
            &self.head.state,
            self.head.held_reason.as_deref(),
            self.head.token,
            [self.created_at, self.updated_at, self.head.expires_at].map(wall),
            self.head.lease_until.map(wall),
            self.status.and_then(|s| u16::try_from(s).ok()),
            self.body_bytes.and_then(|b| u64::try_from(b).ok()),
        )
        .map(|info| {
            let asked = u32::try_from(self.head.inquiries).unwrap_or(0);
            info.with_inquiry(asked, self.head.inquiring_since.map(wall))
        })
        .ok_or_else(|| corrupt(&format!("state {:?}", self.head.state)))
    }
}

#[async_trait::async_trait]
impl StoreAdmin for SqliteStore {
    async fn close(&self) {
        self.writer.close().await;
        self.readers.close().await;
    }

    async fn relay_wakeups(&self, waiters: Arc<Waiters>) {
        let _ = self.waiters.set(waiters.clone());
        let mut last = None;
        let mut poll = tokio::time::interval(WAKE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            poll.tick().await;
            if self.wait_routes.is_empty() {
                // Nobody waits (a reload may change that): nothing to
                // read, and announcements read later start afresh.
                last = None;
                continue;
            }
            let Some(after) = last else {
                // Start after the newest announcement; anything before is
                // unknown to this relay, so wake everyone once.
                let newest = self
                    .read(async |conn| {
                        sqlx::query_scalar("SELECT COALESCE(max(seq), 0) FROM idemgate_wakeups")
                            .fetch_one(conn)
                            .await
                            .map_err(unavailable)
                    })
                    .await;
                if let Ok(newest) = newest {
                    last = Some(newest);
                    waiters.wake_all();
                }
                continue;
            };
            match self.read_wakeups(after, &waiters).await {
                Ok(newest) => last = Some(newest),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the SQLite store's wake-ups; retrying");
                }
            }
        }
    }

    async fn sweep(&self, batch: usize) -> Result<Swept, StoreError> {
        match self.write(Op::Sweep { batch }).await? {
            Reply::Swept(n) => Ok(Swept::of_batch(n, batch)),
            other => Err(corrupt(&format!("the writer answered {other:?}"))),
        }
    }

    async fn take_inquiries(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError> {
        let op = Op::TakeInquiries {
            routes: routes.to_vec(),
            lease,
            limit,
        };
        match self.write(op).await? {
            Reply::Taken(taken) => {
                for inquiry in &taken {
                    self.announce_here(&inquiry.key);
                }
                Ok(taken)
            }
            other => Err(corrupt(&format!("the writer answered {other:?}"))),
        }
    }

    async fn count_inquiring(&self, routes: &[InquiringRoute]) -> Result<u64, StoreError> {
        if routes.is_empty() {
            return Ok(0);
        }
        // Through the listing index (route, state, …); numbered after ?1.
        let names: Vec<String> = (2..2 + routes.len()).map(|n| format!("?{n}")).collect();
        let sql = format!(
            "SELECT count(*) FROM idemgate_records
              WHERE route IN ({}) AND state = 'inquiring' AND expires_at > ?1",
            names.join(", ")
        );
        let n: i64 = self
            .read(async |conn| {
                let mut count = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(now_us());
                for route in routes {
                    count = count.bind(route.name.as_str());
                }
                count.fetch_one(conn).await.map_err(unavailable)
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let sql = format!("SELECT {INFO_COLUMNS} WHERE {KEY}");
        let row: Option<InfoRow> = self
            .read(async |conn| {
                bind_key!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), key)
                    .fetch_optional(conn)
                    .await
                    .map_err(unavailable)
            })
            .await?;
        row.map(InfoRow::into_info).transpose()
    }

    async fn recorded(&self, key: &RecordKey) -> Result<Option<StoredResponse>, StoreError> {
        let row = self.read(async |conn| read_row(conn, key).await).await?;
        row.filter(|row| row.head.state == "completed")
            .map(rows::Row::response)
            .transpose()
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        let sql = format!(
            "SELECT {INFO_COLUMNS} WHERE route = ?1 AND state = ?2 ORDER BY updated_at LIMIT ?3"
        );
        let rows: Vec<InfoRow> = self
            .read(async |conn| {
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(route)
                    .bind(state.as_str())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(conn)
                    .await
                    .map_err(unavailable)
            })
            .await?;
        rows.into_iter().map(InfoRow::into_info).collect()
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.remove(key, Removal::Clear { force }).await
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.remove(key, Removal::Delete { force }).await
    }

    async fn erase(&self, step: &EraseStep<'_>) -> Result<Erased, EraseStepFailed> {
        let (route, scope) = (step.route, step.scope);
        let op = Op::Erase {
            route: route.to_string(),
            scope: scope.to_vec(),
            force: step.force,
            limit: step.limit,
            after: step.after.map(str::to_string),
        };
        // A step that fails is rolled back with its savepoint: it removed
        // nothing, so its error alone is the answer.
        match self.write(op).await? {
            Reply::Erased(erased) => {
                for key in &erased.keys {
                    self.announce_here(&RecordKey {
                        route: route.to_string(),
                        scope: scope.to_vec(),
                        key: key.clone(),
                    });
                }
                Ok(erased)
            }
            other => Err(corrupt(&format!("the writer answered {other:?}")).into()),
        }
    }

    #[cfg(feature = "test-hooks")]
    async fn age(&self, key: &RecordKey, by: Duration) -> Result<bool, StoreError> {
        let op = Op::Age {
            key: key.clone(),
            by,
        };
        self.applied(op).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let version = self
            .read(async |conn| schema::version(conn).await.map_err(unavailable))
            .await?;
        if version >= schema::VERSION {
            Ok(())
        } else {
            Err(StoreError::NotMigrated(format!(
                "schema version {version}, this build needs {}",
                schema::VERSION
            )))
        }
    }

    fn pool_stats(&self) -> Option<crate::PoolStats> {
        // The readers, and the writer's one connection.
        let max = self.readers.options().get_max_connections() + 1;
        let connections = self.readers.size() + 1;
        let idle = self.readers.num_idle() as u32;
        Some(crate::PoolStats {
            connections: u64::from(connections),
            idle: u64::from(idle),
            max: u64::from(max),
        })
    }
}
